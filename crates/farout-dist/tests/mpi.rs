//! Runs the MPI self-test binary under `mpirun -np 1/2/4` (feature `mpi` only).
//!
//! Skipped, with a printed reason, when `mpirun` is not on PATH. Each launch is bounded by a
//! timeout so that a hung collective fails the test instead of hanging it.
#![cfg(feature = "mpi")]

use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const SELFTEST: &str = env!("CARGO_BIN_EXE_farout-mpi-selftest");
const TIMEOUT: Duration = Duration::from_secs(120);

/// One mpirun at a time: on a 2-core machine concurrent oversubscribed jobs distort timings.
static MPIRUN: Mutex<()> = Mutex::new(());

fn have_mpirun() -> bool {
    match Command::new("mpirun").arg("--version").output() {
        Ok(out) if out.status.success() => true,
        Ok(out) => {
            eprintln!("skipped: `mpirun --version` failed: {}", String::from_utf8_lossy(&out.stderr));
            false
        }
        Err(e) => {
            eprintln!("skipped: mpirun is not on PATH ({e}); apt-get install openmpi-bin");
            false
        }
    }
}

/// `mpirun -np ranks SELFTEST`, with `env` exported to every rank; waits at most `TIMEOUT`.
fn mpirun(ranks: usize, env: &[(&str, &str)], args: &[&str]) -> (Output, Duration) {
    let _one_at_a_time = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new("mpirun");
    // --allow-run-as-root: CI runs as root; --oversubscribe: 4 ranks on 2 cores.
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", &ranks.to_string()]);
    for (k, v) in env {
        cmd.args(["-x", &format!("{k}={v}")]);
    }
    cmd.arg(SELFTEST).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn mpirun");
    loop {
        if child.try_wait().expect("wait for mpirun").is_some() {
            break;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect mpirun output");
            panic!(
                "mpirun -np {ranks} did not finish within {TIMEOUT:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("collect mpirun output");
    (out, start.elapsed())
}

#[test]
fn selftest_passes_on_1_2_and_4_ranks() {
    if !have_mpirun() {
        return;
    }
    for (ranks, args) in [(1, &[][..]), (2, &[]), (4, &[]), (2, &["--connect"])] {
        let (out, took) = mpirun(ranks, &[], args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "mpirun -np {ranks} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        );
        // Only rank 0 prints the summary line.
        let summary: Vec<&str> = stdout.lines().filter(|l| l.starts_with("farout-mpi-selftest:")).collect();
        assert_eq!(summary.len(), 1, "one summary line expected:\n{stdout}");
        assert!(summary[0].contains(&format!("{ranks} ranks")), "{}", summary[0]);
        assert!(summary[0].contains(" 0 failed"), "{}", summary[0]);
        println!("mpirun -np {ranks} {args:?}: {:.2} s wall; {}", took.as_secs_f64(), summary[0]);
    }
}

#[test]
fn selftest_fails_on_a_wrong_contribution() {
    if !have_mpirun() {
        return;
    }
    let (out, took) = mpirun(2, &[("FAROUT_SELFTEST_BREAK", "1")], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a wrong contribution went unnoticed");
    assert!(stderr.contains("FAIL rank 0: allreduce_sum_f64"), "{stderr}");
    println!("mpirun -np 2 with a broken rank: failed as it should in {:.2} s", took.as_secs_f64());
}
