//! Ranks as threads of one process: sharded code run at P ranks in a unit test, without MPI.
//!
//! ```
//! use farout_dist::{Collective, Threads};
//!
//! // Each rank holds a share of the numbers; one allreduce gives every rank the total.
//! let totals = Threads::run(3, |comm| {
//!     let mut sum = [(comm.rank() + 1) as f64];
//!     comm.allreduce_sum_f64(&mut sum).unwrap();
//!     sum[0]
//! });
//! assert_eq!(totals, vec![6.0; 3]);
//! ```

use crate::{Collective, DistError, check_alltoallv, check_gatherv, check_root};
use std::sync::{Condvar, Mutex, MutexGuard};

/// One of `size` ranks that are threads of this process ([`Threads::run`]). Every collective
/// call puts this rank's contribution in a shared slot, waits for all ranks, and reads every
/// slot; reductions add or compare in rank order, so all ranks get the same bits, as MPI's do.
/// Arguments are validated as [`crate::Local`] and the MPI implementation validate them.
pub struct Threads<'a> {
    rank: usize,
    size: usize,
    exchange: &'a Exchange,
}

/// What the ranks share: a slot per rank and a barrier that fails (rather than waits forever)
/// once any rank has panicked.
struct Exchange {
    state: Mutex<State>,
    turn: Condvar,
}

struct State {
    slots: Vec<Vec<u8>>,
    arrived: usize,
    generation: u64,
    poisoned: bool,
}

impl Exchange {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until all `size` ranks have called it; panics if a rank panicked.
    fn wait(&self, size: usize) {
        let mut state = self.lock();
        assert!(!state.poisoned, "{POISONED}");
        let generation = state.generation;
        state.arrived += 1;
        if state.arrived == size {
            state.arrived = 0;
            state.generation += 1;
            self.turn.notify_all();
            return;
        }
        while state.generation == generation && !state.poisoned {
            state = self.turn.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        assert!(!state.poisoned, "{POISONED}");
    }

    fn poison(&self) {
        self.lock().poisoned = true;
        self.turn.notify_all();
    }
}

/// The panic of a rank stopped by another rank's panic.
const POISONED: &str = "another rank panicked";

fn is_poison(panic: &(dyn std::any::Any + Send)) -> bool {
    let text = panic.downcast_ref::<String>().map(String::as_str).or_else(|| panic.downcast_ref::<&str>().copied());
    text == Some(POISONED)
}

/// Marks the exchange poisoned when its rank unwinds, so that the others stop waiting.
struct PoisonOnPanic<'a>(&'a Exchange);

impl Drop for PoisonOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.poison();
        }
    }
}

impl Threads<'_> {
    /// Runs `f` on `size` ranks, each a thread of this process, and returns their results in
    /// rank order. A panic on any rank ends every rank and is re-raised here.
    pub fn run<T: Send>(size: usize, f: impl Fn(&dyn Collective) -> T + Sync) -> Vec<T> {
        assert!(size >= 1, "a job has at least one rank");
        let exchange = Exchange {
            state: Mutex::new(State { slots: vec![Vec::new(); size], arrived: 0, generation: 0, poisoned: false }),
            turn: Condvar::new(),
        };
        std::thread::scope(|scope| {
            let ranks: Vec<_> = (0..size)
                .map(|rank| {
                    let (exchange, f) = (&exchange, &f);
                    scope.spawn(move || {
                        let _guard = PoisonOnPanic(exchange);
                        f(&Threads { rank, size, exchange })
                    })
                })
                .collect();
            let mut results = Vec::with_capacity(size);
            let mut first_panic = None;
            for rank in ranks {
                match rank.join() {
                    Ok(r) => results.push(r),
                    // The rank that failed, rather than the ones it stopped.
                    Err(panic) if first_panic.is_none() || !is_poison(&*panic) => first_panic = Some(panic),
                    Err(_) => {}
                }
            }
            if let Some(panic) = first_panic {
                std::panic::resume_unwind(panic);
            }
            results
        })
    }

    /// Every rank's `bytes`, in rank order.
    fn exchange(&self, bytes: Vec<u8>) -> Vec<Vec<u8>> {
        self.exchange.lock().slots[self.rank] = bytes;
        self.exchange.wait(self.size);
        let all = self.exchange.lock().slots.clone();
        // Nobody writes the next call's slot before everyone has read this one.
        self.exchange.wait(self.size);
        all
    }

    /// Every rank's `values`, in rank order.
    fn gather<T: Element>(&self, values: &[T]) -> Vec<Vec<T>> {
        let all = self.exchange(values.iter().flat_map(|v| v.to_bytes()).collect());
        all.iter().map(|b| b.chunks_exact(T::BYTES).map(T::from_bytes).collect()).collect()
    }

    /// Element-wise `combine` of every rank's `buf`, in rank order, into `buf`.
    fn reduce<T: Element>(&self, buf: &mut [T], combine: impl Fn(T, T) -> T) -> Result<(), DistError> {
        let all = self.gather(buf);
        if let Some(other) = all.iter().find(|v| v.len() != buf.len()) {
            return Err(DistError::Mpi(format!("allreduce: buffers of {} and {} elements", buf.len(), other.len())));
        }
        for (at, out) in buf.iter_mut().enumerate() {
            *out = all[1..].iter().fold(all[0][at], |acc, v| combine(acc, v[at]));
        }
        Ok(())
    }

    fn allgatherv<T: Element>(&self, send: &[T], counts: &[usize], out: &mut [T]) -> Result<(), DistError> {
        check_gatherv(self.rank, self.size, send.len(), counts, out.len())?;
        let all = self.gather(send);
        for (r, v) in all.iter().enumerate() {
            if v.len() != counts[r] {
                return Err(DistError::SendLength { rank: r, send: v.len(), count: counts[r] });
            }
        }
        out.iter_mut().zip(all.into_iter().flatten()).for_each(|(o, v)| *o = v);
        Ok(())
    }
}

/// A number that travels as little-endian bytes.
trait Element: Copy {
    const BYTES: usize;
    fn to_bytes(self) -> Vec<u8>;
    fn from_bytes(b: &[u8]) -> Self;
}

macro_rules! element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const BYTES: usize = std::mem::size_of::<$t>();
            fn to_bytes(self) -> Vec<u8> {
                self.to_le_bytes().to_vec()
            }
            fn from_bytes(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("chunks of the element's size"))
            }
        }
    )*};
}
element!(f32, f64, u32, u64);

impl Collective for Threads<'_> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn allreduce_sum_f64(&self, buf: &mut [f64]) -> Result<(), DistError> {
        self.reduce(buf, |a, b| a + b)
    }

    fn allreduce_sum_f32(&self, buf: &mut [f32]) -> Result<(), DistError> {
        self.reduce(buf, |a, b| a + b)
    }

    fn allreduce_sum_u64(&self, buf: &mut [u64]) -> Result<(), DistError> {
        self.reduce(buf, |a, b| a.wrapping_add(b))
    }

    fn allreduce_max_f32(&self, buf: &mut [f32]) -> Result<(), DistError> {
        self.reduce(buf, |a, b| if b > a { b } else { a })
    }

    fn allreduce_max_f64(&self, buf: &mut [f64]) -> Result<(), DistError> {
        self.reduce(buf, |a, b| if b > a { b } else { a })
    }

    fn allgatherv_f32(&self, send: &[f32], counts: &[usize], out: &mut [f32]) -> Result<(), DistError> {
        self.allgatherv(send, counts, out)
    }

    fn allgatherv_u32(&self, send: &[u32], counts: &[usize], out: &mut [u32]) -> Result<(), DistError> {
        self.allgatherv(send, counts, out)
    }

    fn alltoallv_u32(
        &self,
        send: &[u32],
        counts: &[usize],
        out: &mut Vec<u32>,
        out_counts: &mut Vec<usize>,
    ) -> Result<(), DistError> {
        check_alltoallv(self.size, send.len(), counts)?;
        // Every rank's counts and values; rank r keeps its part of each.
        let sizes = self.gather(&counts.iter().map(|&c| c as u64).collect::<Vec<_>>());
        let all = self.gather(send);
        out.clear();
        out_counts.clear();
        for (sizes, values) in sizes.iter().zip(&all) {
            let at = sizes[..self.rank].iter().sum::<u64>() as usize;
            let n = sizes[self.rank] as usize;
            out.extend_from_slice(&values[at..at + n]);
            out_counts.push(n);
        }
        Ok(())
    }

    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<(), DistError> {
        check_root(root, self.size)?;
        let mut all = self.exchange(std::mem::take(buf));
        *buf = std::mem::take(&mut all[root]);
        Ok(())
    }

    fn barrier(&self) -> Result<(), DistError> {
        self.exchange.wait(self.size);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank r sends rank q `r + q` values; every rank receives, in rank order, what each sent it.
    #[test]
    fn alltoallv_delivers_each_ranks_part_in_rank_order() {
        for size in [1, 2, 3] {
            let out = Threads::run(size, |c| {
                let me = c.rank();
                let counts: Vec<usize> = (0..size).map(|q| me + q).collect();
                let send: Vec<u32> =
                    (0..size).flat_map(|q| (0..me + q).map(move |j| (100 * me + 10 * q + j) as u32)).collect();
                let (mut out, mut got) = (Vec::new(), Vec::new());
                c.alltoallv_u32(&send, &counts, &mut out, &mut got).unwrap();
                (out, got)
            });
            for (q, (values, counts)) in out.iter().enumerate() {
                let want: Vec<u32> =
                    (0..size).flat_map(|r| (0..r + q).map(move |j| (100 * r + 10 * q + j) as u32)).collect();
                assert_eq!(values, &want, "{size} ranks, rank {q}");
                assert_eq!(counts, &(0..size).map(|r| r + q).collect::<Vec<_>>(), "{size} ranks, rank {q}");
            }
        }
        let bad = Threads::run(2, |c| c.alltoallv_u32(&[1, 2], &[1, 2], &mut Vec::new(), &mut Vec::new()));
        assert!(bad.iter().all(Result::is_err), "counts that do not add up to the send buffer: {bad:?}");
    }

    #[test]
    fn reductions_combine_every_rank_in_rank_order() {
        let out = Threads::run(4, |c| {
            let r = c.rank() as f64;
            let mut s = [r, 1.0];
            c.allreduce_sum_f64(&mut s).unwrap();
            let mut m = [r as f32, -(r as f32)];
            c.allreduce_max_f32(&mut m).unwrap();
            let mut u = [c.rank() as u64 + 1];
            c.allreduce_sum_u64(&mut u).unwrap();
            (s, m, u[0], c.size())
        });
        for o in out {
            assert_eq!(o, ([6.0, 4.0], [3.0, 0.0], 10, 4));
        }
    }

    #[test]
    fn gathers_concatenate_in_rank_order_and_broadcast_copies_the_root() {
        let out = Threads::run(3, |c| {
            let r = c.rank();
            let send: Vec<u32> = (0..r as u32).map(|i| 10 * r as u32 + i).collect();
            let mut got = vec![0u32; 3];
            c.allgatherv_u32(&send, &[0, 1, 2], &mut got).unwrap();
            let mut eq = vec![0f32; 6];
            c.allgather_f32(&[r as f32, 0.5], &mut eq).unwrap();
            let mut bytes = if r == 1 { vec![7u8, 8] } else { Vec::new() };
            c.broadcast_bytes(1, &mut bytes).unwrap();
            c.barrier().unwrap();
            (got, eq, bytes)
        });
        for o in out {
            assert_eq!(o, (vec![10, 20, 21], vec![0.0, 0.5, 1.0, 0.5, 2.0, 0.5], vec![7, 8]));
        }
    }

    #[test]
    fn bad_arguments_are_errors_before_communicating() {
        let out = Threads::run(2, |c| {
            let mut out = [0f32; 2];
            let wrong_counts = c.allgatherv_f32(&[1.0], &[1], &mut out);
            let bad_root = c.broadcast_bytes(5, &mut Vec::new());
            (wrong_counts.is_err(), bad_root.is_err())
        });
        assert_eq!(out, vec![(true, true); 2]);
    }

    #[test]
    fn a_panicking_rank_ends_the_others_instead_of_hanging() {
        let result = std::panic::catch_unwind(|| {
            Threads::run(3, |c| {
                if c.rank() == 2 {
                    panic!("rank 2 fails");
                }
                c.barrier().unwrap();
            })
        });
        let panic = result.unwrap_err();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"rank 2 fails"), "the failing rank's panic is re-raised");
    }
}
