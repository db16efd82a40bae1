//! Successive halving within a wall-clock budget.
//!
//! A bracket draws `ETA^RUNGS_ABOVE` settings (the first bracket's first is the base config
//! itself), trains each with the least resource (`1/ETA^2` of the epochs, or of the training
//! rows for a linear solver, which trains in one go), keeps the best `1/ETA` of them, trains
//! those with `ETA` times the resource, and so on up to the full resource: a bracket costs
//! about `RUNGS_ABOVE + 1` full runs however many settings it tries (Jamieson & Talwalkar 2016,
//! "Non-stochastic best arm identification and hyperparameter optimization", Alg. 1). Brackets
//! repeat, with new draws, until the budget is spent.
//!
//! A promoted trial starts from where its setting's run of the rung below left off where that
//! gives the same figure ([`super::warm`]): a network bracket then costs `1 + 2/3 + 2/3` full
//! runs instead of 3 (each rung's trials train only the epochs the rung below did not). A
//! linear trial starts from a neighbouring C's model, which saves Newton iterations.

use super::recipe::{Recipe, Setting};
use super::trials::{Stop, Trial};
use farout_core::rng::seeded;
use farout_core::space::Dim;
use std::collections::HashMap;

/// The halving rate η: each rung keeps the best third and gives it three times the resource.
pub const ETA: usize = 3;
/// Rungs above the first: three rungs, at 1/9, 1/3 and all of the resource.
pub const RUNGS_ABOVE: u32 = 2;

/// The epochs of the top rung when `--max-epochs` does not say: `ETA` times the recipe's
/// `epochs` for a network classifier, so that its rungs train `epochs / ETA`, `epochs` and
/// `ETA epochs` (rounded up; a one-epoch recipe: 1, 1 and 3) and the search chooses the
/// training length too; a skip-gram recipe's own epochs (its trials train from scratch, so
/// each rung costs all its epochs again).
pub fn default_max_epochs(kind: crate::task::TaskKind, epochs: usize) -> usize {
    match kind {
        crate::task::TaskKind::Classifier => ETA * epochs,
        _ => epochs,
    }
}

/// What a trial trains with more of at each rung.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Resource {
    /// Epochs (networks, skip-gram), up to this many at the top rung.
    Epochs(usize),
    /// A fraction of the training rows (linear solvers).
    Rows,
}

impl Resource {
    /// The resource of rung `rung`: `ETA^(rung - RUNGS_ABOVE)` of the full one, at least one
    /// epoch.
    pub fn at(self, rung: usize) -> f64 {
        let share = (ETA as f64).powi(rung as i32 - RUNGS_ABOVE as i32);
        match self {
            Resource::Epochs(e) => (e as f64 * share).ceil().max(1.0),
            Resource::Rows => share,
        }
    }

    /// The setting that gives a trial the resource `r`.
    pub fn setting(self, r: f64) -> Setting {
        match self {
            Resource::Epochs(_) => ("train.epochs".into(), format!("{}", r as usize)),
            Resource::Rows => ("data.train_fraction".into(), format!("{r:?}")),
        }
    }

    /// The unit's name in tables.
    pub fn unit(self) -> &'static str {
        match self {
            Resource::Epochs(_) => "epochs",
            Resource::Rows => "train fraction",
        }
    }
}

/// The settings of bracket `bracket`: `ETA^RUNGS_ABOVE` draws from `space` (the first
/// bracket's first setting is the base config's own), fixed by `seed`.
pub fn draws(space: &[Dim], bracket: usize, seed: u64) -> Vec<Vec<Setting>> {
    let mut rng = seeded(seed, 0x7D4E_0000 + bracket as u64);
    let n = ETA.pow(RUNGS_ABOVE);
    (0..n)
        .map(|i| {
            let drawn: Vec<Setting> = space.iter().map(|d| (d.key.to_string(), d.draw(&mut rng).to_string())).collect();
            if bracket == 0 && i == 0 { Vec::new() } else { drawn }
        })
        .collect()
}

/// Which trials of a rung go on: the best `len / ETA` (at least one) by metric, failed trials
/// never; ties keep the earlier trial.
pub fn promote(metrics: &[Option<f64>], higher_is_better: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..metrics.len()).filter(|&i| metrics[i].is_some()).collect();
    let key = |i: &usize| metrics[*i].expect("filtered");
    order.sort_by(|a, b| {
        let (x, y) = (key(a), key(b));
        let c = if higher_is_better { y.total_cmp(&x) } else { x.total_cmp(&y) };
        c.then(a.cmp(b))
    });
    order.truncate((metrics.len() / ETA).max(1));
    order
}

/// The best trial: the best metric among the trials of the highest rung any trial finished
/// (a figure on more epochs or data is the one the final run repeats).
pub fn best(trials: &[Trial], higher_is_better: bool) -> Option<&Trial> {
    let done = |t: &&Trial| t.metric.is_some() && t.stop != Stop::Budget;
    let top = trials.iter().filter(done).map(|t| t.rung).max()?;
    trials.iter().filter(done).filter(|t| t.rung == top).min_by(|a, b| {
        let (x, y) = (a.metric.expect("done"), b.metric.expect("done"));
        if higher_is_better { y.total_cmp(&x) } else { x.total_cmp(&y) }
    })
}

/// Earlier trials by (id, rung), for a resumed search: a trial is reused when its settings are
/// the same and it was not cut short by the budget.
pub fn earlier(trials: Vec<Trial>) -> HashMap<(usize, usize), Trial> {
    trials.into_iter().filter(|t| t.stop != Stop::Budget).map(|t| ((t.id, t.rung), t)).collect()
}

/// The seconds a trial of rung `rung` is expected to take: the mean of that rung's trials so
/// far, else the nearest rung below's seconds per unit of resource trained times the resource
/// this trial trains (`continues`: a continued network run trains only what the rung below did not,
/// e.g. 2/9 of the epochs at rung 1 instead of 3/9).
pub fn expected_seconds(trials: &[Trial], rung: usize, resource: Resource, continues: bool) -> Option<f64> {
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let trained = |r: usize, cont: bool| resource.at(r) - if cont && r > 0 { resource.at(r - 1) } else { 0.0 };
    let same: Vec<f64> = trials.iter().filter(|t| t.rung == rung).map(|t| t.seconds).collect();
    if let Some(m) = mean(same) {
        return Some(m);
    }
    // Per unit trained at the nearest rung below that trained any (a continued rung may add no
    // epochs: a one-epoch recipe's rungs train 1, 1 and 3).
    (0..rung).rev().find_map(|r| {
        let below = trials.iter().filter(|t| t.rung == r && trained(r, t.continued()) > 0.0);
        let rates: Vec<f64> = below.map(|t| t.seconds / trained(r, t.continued())).collect();
        mean(rates).map(|rate| rate * trained(rung, continues))
    })
}

/// The recipe of a trial: its settings, then the resource's.
pub fn trial_settings(settings: &[Setting], resource: Resource, r: f64) -> Vec<Setting> {
    let mut s = settings.to_vec();
    s.push(resource.setting(r));
    s
}

/// Checks that the base recipe takes the resource's setting at every rung.
pub fn check_resource(recipe: &Recipe, resource: Resource) -> Result<(), crate::config::ConfigError> {
    for rung in 0..=RUNGS_ABOVE as usize {
        recipe.config(&[resource.setting(resource.at(rung))])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rungs_give_a_ninth_a_third_and_all_of_the_resource() {
        let e = Resource::Epochs(9);
        assert_eq!((e.at(0), e.at(1), e.at(2)), (1.0, 3.0, 9.0));
        assert_eq!(Resource::Epochs(5).at(0), 1.0);
        assert!((Resource::Rows.at(0) - 1.0 / 9.0).abs() < 1e-12);
    }

    #[test]
    fn halving_keeps_the_best_third_and_never_a_failed_trial() {
        let m = [Some(0.5), Some(0.7), None, Some(0.6), Some(0.1), Some(0.65)];
        assert_eq!(promote(&m, true), vec![1, 5]);
        assert_eq!(promote(&m, false), vec![4, 0]);
        assert_eq!(promote(&[None, Some(0.2)], true), vec![1]);
    }

    #[test]
    fn the_first_draw_is_the_base_config_and_draws_are_seeded() {
        let space = vec![Dim::float_log("linear.c", 0.1, 10.0)];
        let a = draws(&space, 0, 5);
        assert!(a[0].is_empty());
        assert_eq!(a.len(), 9);
        assert_eq!(a, draws(&space, 0, 5));
        assert_ne!(draws(&space, 1, 5), a);
    }

    #[test]
    fn the_best_trial_comes_from_the_highest_rung_finished() {
        let t = |id, rung, m, stop| Trial {
            id,
            rung,
            resource: 1.0,
            settings: vec![],
            metric: Some(m),
            seconds: 1.0,
            elapsed: 1.0,
            stop,
            start: String::new(),
        };
        let trials = [t(0, 0, 0.9, Stop::Halved), t(1, 1, 0.6, Stop::Finished), t(2, 1, 0.7, Stop::Finished)];
        assert_eq!(best(&trials, true).unwrap().id, 2);
        assert_eq!(best(&trials, false).unwrap().id, 1);
        let cut = [t(0, 0, 0.5, Stop::Promoted), t(0, 1, 0.9, Stop::Budget)];
        assert_eq!(best(&cut, true).unwrap().rung, 0);
    }

    #[test]
    fn a_continued_trial_is_expected_to_cost_only_the_epochs_it_adds() {
        let t = |rung, seconds, start: &str| Trial {
            id: 0,
            rung,
            resource: 1.0,
            settings: vec![],
            metric: Some(0.5),
            seconds,
            elapsed: 1.0,
            stop: Stop::Promoted,
            start: start.into(),
        };
        let e = Resource::Epochs(9);
        // Rung 0: 1 epoch in 2 s. Rung 1 (3 epochs) continued trains 2 more, from scratch 3.
        let r0 = [t(0, 2.0, "scratch"), t(0, 2.0, "scratch")];
        assert_eq!(expected_seconds(&r0, 1, e, true), Some(4.0));
        assert_eq!(expected_seconds(&r0, 1, e, false), Some(6.0));
        // Rung 2 (9 epochs) after continued rung-1 trials (2 epochs in 4 s): 6 more epochs.
        let r1 = [t(1, 4.0, "continues 0-r0")];
        assert_eq!(expected_seconds(&r1, 2, e, true), Some(12.0));
        assert_eq!(expected_seconds(&r1, 1, e, true), Some(4.0), "the rung's own trials first");
        assert_eq!(expected_seconds(&r0, 0, Resource::Rows, false), Some(2.0));
        assert_eq!(expected_seconds(&[], 1, Resource::Rows, false), None);
        // Rungs of 1, 1 and 3 epochs: rung 1 continued trains nothing, so rung 0 gives the rate.
        let e = Resource::Epochs(3);
        let r01 = [t(0, 2.0, "scratch"), t(1, 0.5, "continues 0-r0")];
        assert_eq!(expected_seconds(&r01, 2, e, true), Some(4.0));
    }
}
