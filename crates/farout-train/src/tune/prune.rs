//! What a tune keeps on disk: a trial's checkpoints (its resume checkpoint `checkpoint/` and its
//! kept weights `checkpoint-best/`, each holding the output layer's K x D table and more) stay
//! only while a later trial may start from them.
//!
//! - **A network trial** (document encoder, face head) is continued by its setting's trial of
//!   the next rung ([`super::warm`]), which copies its directory. Its checkpoints go as soon as
//!   it cannot be promoted: at the top rung; when it failed or was cut by the budget (a resumed
//!   search runs it again from the rung below); or when `keep` ended trials of its rung are
//!   already better than it (`keep` = `⌊n / ETA⌋`, at least one, of the rung's `n` settings;
//!   a tie goes to the earlier trial, as in [`super::search::promote`]), since more trials
//!   only push it further down. The rung below's copy goes once the continuing trial has ended
//!   (not cut by the budget: a resumed search would continue it from there again). So a search
//!   holds the checkpoints of at most about `keep` trials of the rung, those of the running
//!   jobs, and the promoted trials of the rung below not yet continued; a promoted trial whose
//!   next rung did not run when the search ended keeps its checkpoints for `--resume`.
//! - **A skip-gram trial** never continues (its learning rate decays over the whole run): its
//!   checkpoints go when it ends.
//! - **A linear trial** keeps its model only when later trials start from it (DiSMEC), until
//!   the final run has started from the best trial's; PPDSparse and MEMOIR trials save none.

use super::search::ETA;
use super::trials::{Stop, Trial};
use crate::{Error, io_err};
use std::path::Path;

/// The trials `(id, rung)` of a network search whose checkpoints no later trial needs, given
/// the slots of the rung being run (by place; `None`: not ended) and whether it is the top
/// rung.
pub fn unneeded(slots: &[Option<Trial>], top: bool, higher_is_better: bool) -> Vec<(usize, usize)> {
    let keep = (slots.len() / ETA).max(1);
    let ended: Vec<(usize, &Trial)> = slots.iter().enumerate().filter_map(|(i, t)| Some((i, t.as_ref()?))).collect();
    // Does trial j come before trial i in the promotion order? (A trial cut by the budget runs
    // again when the search resumes: its figure is not final.)
    let better = |(i, a): (usize, &Trial), (j, b): (usize, &Trial)| match (a.metric, b.metric) {
        (Some(x), Some(y)) if b.stop != Stop::Budget => {
            if higher_is_better {
                y > x || (y == x && j < i)
            } else {
                y < x || (y == x && j < i)
            }
        }
        _ => false,
    };
    let mut out = Vec::new();
    for &(i, t) in &ended {
        let doomed = top
            || matches!(t.stop, Stop::Budget | Stop::Failed | Stop::Halved | Stop::Finished)
            || t.metric.is_none()
            || ended.iter().filter(|&&(j, u)| better((i, t), (j, u))).count() >= keep;
        if doomed {
            out.push((t.id, t.rung));
        }
        if t.continued() && t.stop != Stop::Budget && t.rung > 0 {
            out.push((t.id, t.rung - 1));
        }
    }
    out
}

/// Removes the checkpoints of the trial run in `dir`: its resume checkpoint and its kept
/// weights, with the directories a save passes through and a kept previous one (its logs
/// stay).
pub fn remove_checkpoints(dir: &Path) -> Result<(), Error> {
    for name in ["checkpoint", "checkpoint-best"] {
        let base = dir.join(name);
        let mut all = crate::checkpoint::with_siblings(&base).to_vec();
        all.push(crate::checkpoint::previous(&base));
        for d in all {
            // Another job may have removed it just now.
            match std::fs::remove_dir_all(&d) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(&d)(e)),
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: usize, rung: usize, metric: Option<f64>, stop: Stop, start: &str) -> Option<Trial> {
        Some(Trial {
            id,
            rung,
            resource: 1.0,
            settings: vec![],
            metric,
            seconds: 1.0,
            elapsed: 1.0,
            stop,
            start: start.into(),
        })
    }

    #[test]
    fn a_trial_goes_once_enough_of_its_rung_beat_it() {
        let p = Stop::Pending;
        // Nine settings, three promoted: trial 1 is beaten by three ended trials, the others
        // may still be among the best three; the failed trial 5 and the cut trial 6 go.
        let mut slots = vec![
            t(0, 0, Some(0.5), p, "scratch"),
            t(1, 0, Some(0.1), p, "scratch"),
            t(2, 0, Some(0.7), p, "scratch"),
            t(3, 0, Some(0.6), p, "scratch"),
            t(4, 0, Some(0.5), p, "scratch"),
            t(5, 0, None, Stop::Failed, "scratch"),
            t(6, 0, Some(0.9), Stop::Budget, "scratch"),
        ];
        slots.extend([None, None]);
        assert_eq!(unneeded(&slots, false, true), vec![(1, 0), (4, 0), (5, 0), (6, 0)], "4 ties 0, later");
        assert_eq!(unneeded(&slots, false, false), vec![(2, 0), (3, 0), (5, 0), (6, 0)], "lower is better");
        assert_eq!(unneeded(&slots[..3], false, true), vec![(0, 0), (1, 0)], "one of three promoted");
        assert_eq!(unneeded(&slots[..2], true, true), vec![(0, 0), (1, 0)], "nothing above the top rung");
    }

    #[test]
    fn the_rung_below_goes_once_its_continuation_ended_within_the_budget() {
        let slots = vec![
            t(0, 1, Some(0.5), Stop::Pending, "continues 0-r0"),
            t(3, 1, Some(0.4), Stop::Budget, "continues 3-r0"),
            t(4, 1, Some(0.6), Stop::Pending, "scratch"),
            None,
        ];
        // Trial 3 was cut: a resumed search continues it from 3-r0 again, which stays.
        assert_eq!(unneeded(&slots, false, true), vec![(0, 1), (0, 0), (3, 1)]);
        let promoted = vec![t(0, 1, Some(0.5), Stop::Promoted, "continues 0-r0")];
        assert_eq!(unneeded(&promoted, false, true), vec![(0, 0)], "the promoted trial keeps its own");
    }
}
