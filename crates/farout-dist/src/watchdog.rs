//! A rank that dies must not leave the others waiting in a collective forever.
//!
//! MPI gives a rank no way to learn that a peer died: a collective with a dead rank simply never
//! completes. Open MPI's `mpirun` aborts the whole job when one of its processes dies (it
//! prints `mpirun noticed that process rank R ... exited on signal 9`), but other launchers do
//! not always (Slurm's `srun` without `--kill-on-bad-exit`, `mpirun --enable-recovery`), and a
//! rank that returns early by mistake ends normally. [`Watched`] wraps a [`Collective`] and runs
//! a thread that, while this rank is inside a collective, checks every [`TICK`] whether the
//! ranks on the same machine are still alive (their process in `/proc`, with the start time it
//! had when the job began, so a reused pid does not count). When one collective has lasted
//! [`GRACE`] past the moment a peer was found gone, the rank prints which rank is lost and
//! ends at once (`_exit(1)`, no MPI finalisation, which would wait for the dead rank too).
//!
//! The grace period lets a collective that the dead rank had already contributed to finish
//! (the normal end of a job: the ranks leave MPI at slightly different times). Ranks on other
//! machines cannot be watched this way; a job spread over several machines relies on its
//! launcher for them (the watched ranks on the lost rank's machine stop, and the launcher sees
//! that too).

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::{Collective, DistError};

/// How often the watching thread looks.
pub const TICK: Duration = Duration::from_millis(200);
/// How long one collective may last after a peer was found gone before the rank stops.
pub const GRACE: Duration = Duration::from_secs(2);

/// One rank's process, as it can be recognised from another process on the same machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its rank.
    pub rank: usize,
    /// Its process id.
    pub pid: u32,
    /// The process's start time (clock ticks since boot, `/proc/PID/stat` field 22).
    pub start: u64,
    /// Where the pid is meaningful: the machine's boot id and the pid namespace.
    pub place: String,
    /// The machine's host name, for messages.
    pub host: String,
}

impl Peer {
    /// This process as rank `rank`; `None` where `/proc` does not describe it (not Linux).
    pub fn me(rank: usize) -> Option<Peer> {
        let pid = std::process::id();
        let start = start_time(pid)?;
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let place = format!("{} {}", boot.trim(), ns.display());
        Some(Peer { rank, pid, start, place, host: host.trim().to_string() })
    }

    fn encode(&self) -> Vec<u8> {
        format!("{}\n{}\n{}\n{}", self.pid, self.start, self.place, self.host).into_bytes()
    }

    fn decode(rank: usize, bytes: &[u8]) -> Option<Peer> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut it = text.splitn(4, '\n');
        let pid = it.next()?.parse().ok()?;
        let start = it.next()?.parse().ok()?;
        let (place, host) = (it.next()?.to_string(), it.next()?.to_string());
        Some(Peer { rank, pid, start, place, host })
    }

    /// Whether the process is gone: no longer in `/proc`, a zombie, or a newer process that
    /// reuses its pid.
    pub fn gone(&self) -> bool {
        start_time(self.pid) != Some(self.start)
    }
}

/// Field 22 (start time) of `/proc/PID/stat`, or `None` if the process is gone or a zombie.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (the state); field 22 is rest's 20th (index 19).
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// What the watching thread decides at each look.
#[derive(Debug, Default)]
struct Verdict {
    /// The collective (its number) during which a peer was first seen gone, and when.
    seen: Option<(u64, Instant)>,
}

impl Verdict {
    /// `call`: the number of the collective in progress (`None` outside one); `lost`: whether a
    /// watched peer is gone. True once one collective has lasted [`GRACE`] past the moment a
    /// peer was seen gone during it.
    fn stop(&mut self, call: Option<u64>, lost: bool, now: Instant) -> bool {
        let (Some(call), true) = (call, lost) else {
            self.seen = None;
            return false;
        };
        match self.seen {
            Some((c, at)) if c == call => now.duration_since(at) >= GRACE,
            _ => {
                self.seen = Some((call, now));
                false
            }
        }
    }
}

/// State shared with the watching thread.
#[derive(Debug, Default)]
struct Shared {
    /// Twice the number of collectives begun, plus one while one is in progress.
    calls: AtomicU64,
    /// Set when the collective is dropped: the thread ends.
    done: AtomicBool,
}

/// A [`Collective`] whose rank stops, naming the lost rank, when a rank on the same machine
/// dies while this one waits for it (see the module documentation).
pub struct Watched<C: Collective> {
    inner: ManuallyDrop<C>,
    shared: Arc<Shared>,
}

impl<C: Collective> Watched<C> {
    /// Learns every rank's process (one broadcast per rank) and starts watching the others on
    /// this machine. With one rank, or where `/proc` is missing, nothing is watched.
    pub fn new(inner: C) -> Result<Self, DistError> {
        let shared = Arc::new(Shared::default());
        let (rank, size) = (inner.rank(), inner.size());
        let me = Peer::me(rank);
        let mut peers = Vec::new();
        for root in 0..size {
            let mut buf = if root == rank { me.as_ref().map(Peer::encode).unwrap_or_default() } else { Vec::new() };
            inner.broadcast_bytes(root, &mut buf)?;
            peers.extend(Peer::decode(root, &buf));
        }
        if let Some(me) = me {
            peers.retain(|p| p.rank != rank && p.place == me.place);
            if !peers.is_empty() {
                let watch = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name("farout-watchdog".into())
                    .spawn(move || watch_peers(&watch, &peers, rank, size))
                    .map_err(|e| DistError::Init(format!("cannot start the thread watching the other ranks: {e}")))?;
            }
        }
        Ok(Watched { inner: ManuallyDrop::new(inner), shared })
    }

    fn call<T>(&self, f: impl FnOnce(&C) -> T) -> T {
        self.shared.calls.fetch_add(1, Ordering::SeqCst);
        let out = f(&self.inner);
        self.shared.calls.fetch_add(1, Ordering::SeqCst);
        out
    }
}

/// The watching thread: stops the process when a peer is lost (see [`Verdict::stop`]).
fn watch_peers(shared: &Shared, peers: &[Peer], rank: usize, size: usize) {
    let mut verdict = Verdict::default();
    let started = Instant::now();
    while !shared.done.load(Ordering::SeqCst) {
        std::thread::sleep(TICK);
        let calls = shared.calls.load(Ordering::SeqCst);
        let call = (calls % 2 == 1).then_some(calls / 2);
        let lost: Vec<&Peer> = if call.is_some() { peers.iter().filter(|p| p.gone()).collect() } else { Vec::new() };
        if verdict.stop(call, !lost.is_empty(), Instant::now()) {
            eprintln!("error: {}", lost_message(rank, size, &lost, started.elapsed()));
            end_now();
        }
    }
}

/// Ends the process at once, with status 1. Not `exit`: MPI's exit handlers would wait for
/// the dead rank as well.
#[cfg(target_os = "linux")]
fn end_now() -> ! {
    // SAFETY: `_exit` only ends the process; nothing of it runs afterwards.
    unsafe { libc::_exit(1) }
}

/// Without `/proc` nothing is watched ([`Peer::me`] is `None`), so this is never reached.
#[cfg(not(target_os = "linux"))]
fn end_now() -> ! {
    std::process::abort()
}

/// What a rank prints when it stops because `lost` are gone.
fn lost_message(rank: usize, size: usize, lost: &[&Peer], running: Duration) -> String {
    let who: Vec<String> = lost.iter().map(|p| format!("rank {} (pid {} on {})", p.rank, p.pid, p.host)).collect();
    let prefix = if rank > 0 { format!("(rank {rank}) ") } else { String::new() };
    format!(
        "{prefix}{} of the {size} MPI ranks ended (killed or failed) while rank {rank} waited for it in a collective \
         ({:.0} s into the job): the job cannot go on without it, so rank {rank} stops too. A training run continues \
         from its last complete checkpoint with `mpirun -np {size} farout train CONFIG --resume`",
        who.join(", "),
        running.as_secs_f64()
    )
}

impl<C: Collective> Drop for Watched<C> {
    fn drop(&mut self) {
        // Finalising MPI waits for every rank: watched like a collective.
        self.shared.calls.fetch_add(1, Ordering::SeqCst);
        // SAFETY: `inner` is dropped once, here, and never used again.
        unsafe { ManuallyDrop::drop(&mut self.inner) };
        self.shared.calls.fetch_add(1, Ordering::SeqCst);
        self.shared.done.store(true, Ordering::SeqCst);
    }
}

impl<C: Collective> Collective for Watched<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn allreduce_sum_f64(&self, buf: &mut [f64]) -> Result<(), DistError> {
        self.call(|c| c.allreduce_sum_f64(buf))
    }

    fn allreduce_sum_f32(&self, buf: &mut [f32]) -> Result<(), DistError> {
        self.call(|c| c.allreduce_sum_f32(buf))
    }

    fn allreduce_sum_u64(&self, buf: &mut [u64]) -> Result<(), DistError> {
        self.call(|c| c.allreduce_sum_u64(buf))
    }

    fn allreduce_max_f32(&self, buf: &mut [f32]) -> Result<(), DistError> {
        self.call(|c| c.allreduce_max_f32(buf))
    }

    fn allreduce_max_f64(&self, buf: &mut [f64]) -> Result<(), DistError> {
        self.call(|c| c.allreduce_max_f64(buf))
    }

    fn allgatherv_f32(&self, send: &[f32], counts: &[usize], out: &mut [f32]) -> Result<(), DistError> {
        self.call(|c| c.allgatherv_f32(send, counts, out))
    }

    fn allgatherv_u32(&self, send: &[u32], counts: &[usize], out: &mut [u32]) -> Result<(), DistError> {
        self.call(|c| c.allgatherv_u32(send, counts, out))
    }

    fn alltoallv_u32(
        &self,
        send: &[u32],
        counts: &[usize],
        out: &mut Vec<u32>,
        out_counts: &mut Vec<usize>,
    ) -> Result<(), DistError> {
        self.call(|c| c.alltoallv_u32(send, counts, out, out_counts))
    }

    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<(), DistError> {
        self.call(|c| c.broadcast_bytes(root, buf))
    }

    fn barrier(&self) -> Result<(), DistError> {
        self.call(|c| c.barrier())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Local;

    #[test]
    fn a_process_is_gone_once_it_has_ended_and_been_reaped() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let me = Peer::me(0).expect("Linux describes this process in /proc");
        let peer = Peer { rank: 1, pid: child.id(), start: start_time(child.id()).unwrap(), ..me.clone() };
        assert!(!me.gone() && !peer.gone());
        child.kill().unwrap();
        // Killed but not yet reaped: a zombie, gone already.
        std::thread::sleep(Duration::from_millis(100));
        assert!(peer.gone());
        child.wait().unwrap();
        assert!(peer.gone());
        // A pid reused by another process is not the peer.
        assert!(Peer { start: me.start + 1, ..me.clone() }.gone());
        assert_eq!(Peer::decode(3, &me.encode()), Some(Peer { rank: 3, ..me }));
    }

    #[test]
    fn a_rank_stops_when_one_collective_outlasts_the_grace_after_a_loss() {
        let t0 = Instant::now();
        let mut v = Verdict::default();
        // Nothing lost, or outside a collective: never.
        assert!(!v.stop(Some(1), false, t0 + GRACE * 3));
        assert!(!v.stop(None, true, t0 + GRACE * 3));
        // Lost during call 4: stops once call 4 has lasted GRACE since.
        assert!(!v.stop(Some(4), true, t0));
        assert!(!v.stop(Some(4), true, t0 + GRACE / 2));
        assert!(v.stop(Some(4), true, t0 + GRACE));
        // A call that finishes within the grace starts the count again at the next one.
        let mut v = Verdict::default();
        assert!(!v.stop(Some(4), true, t0));
        assert!(!v.stop(Some(5), true, t0 + GRACE));
        assert!(!v.stop(None, true, t0 + GRACE * 2));
        assert!(!v.stop(Some(6), true, t0 + GRACE * 2));
        assert!(v.stop(Some(6), true, t0 + GRACE * 3));
    }

    #[test]
    fn the_message_names_the_lost_rank_and_what_to_do() {
        let me = Peer::me(1).unwrap();
        let lost = Peer { rank: 0, pid: 42, host: "node7".into(), ..me };
        let m = lost_message(1, 4, &[&lost], Duration::from_secs(12));
        assert!(m.starts_with("(rank 1) rank 0 (pid 42 on node7) of the 4 MPI ranks ended"), "{m}");
        assert!(m.contains("mpirun -np 4 farout train CONFIG --resume"), "{m}");
    }

    #[test]
    fn one_rank_is_passed_through_unwatched() {
        let c = Watched::new(Local).unwrap();
        let mut x = [1.5f32];
        c.allreduce_sum_f32(&mut x).unwrap();
        assert_eq!((c.rank(), c.size(), x[0]), (0, 1, 1.5));
        assert_eq!(c.shared.calls.load(Ordering::SeqCst), 2);
    }
}
