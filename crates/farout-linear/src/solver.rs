//! The solvers of `[linear]`: the registry (the trait they implement is in `contract.rs`).
//!
//! A config selects a solver by name (`[linear] solver = "dismec"`); the other keys of the
//! section are that solver's parameters, a serde struct with the papers' defaults that denies
//! unknown keys. The parameter struct *is* the solver: it implements [`LinearSolver`], checks
//! itself ([`LinearSolver::check`], the error names the key relative to `[linear]`) and trains
//! ([`LinearSolver::fit`]) into a [`SparseModel`] with a [`FitSummary`].
//!
//! A new solver is one file (its parameter struct implementing [`LinearSolver`]) plus one line
//! in [`SolverConfig`]'s list below and its `mod` line in lib.rs.
//!
//! ```toml
//! [linear]
//! solver = "dismec"   # "dismec" | "ppdsparse" | "memoir"
//! init = "msi"        # the solver's own keys
//! ```

use crate::contract::LinearSolver;
use crate::dismec::DismecConfig;
use crate::memoir::MemoirConfig;
use crate::ppdsparse::PpdSparseConfig;

farout_core::plugin_registry! {
    /// The solver of `[linear]` (tag `solver`) with its parameters.
    pub enum SolverConfig: LinearSolver, tag = "solver" {
        /// DiSMEC: squared-hinge one-vs-all by truncated Newton, MSI start, pruning (\[M\]).
        Dismec(DismecConfig) = "dismec",
        /// PPDSparse: primal-dual sparse active-set one-vs-all (\[P\]).
        PpdSparse(PpdSparseConfig) = "ppdsparse",
        /// MEMOIR: multiclass SVM by stochastic subgradient with an inexact argmax (\[E\]).
        Memoir(MemoirConfig) = "memoir",
    }
}

impl Default for SolverConfig {
    fn default() -> Self {
        Self::Dismec(DismecConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Section {
        linear: SolverConfig,
    }

    #[test]
    fn the_tag_selects_the_solver_and_unknown_names_list_the_allowed_ones() {
        let s: Section = toml::from_str("[linear]\nsolver = \"dismec\"\ninit = \"zero\"").unwrap();
        assert_eq!(s.linear.name(), "dismec");
        let e = toml::from_str::<Section>("[linear]\nsolver = \"tron\"").err().unwrap().to_string();
        for name in SolverConfig::NAMES {
            assert!(e.contains(name), "{e}");
        }
        assert!(toml::from_str::<Section>("[linear]\nsolver = \"dismec\"\ncee = 1").is_err());
    }

    #[test]
    fn every_solver_default_passes_its_own_check() {
        for name in SolverConfig::NAMES {
            let s: Section = toml::from_str(&format!("[linear]\nsolver = \"{name}\"")).unwrap();
            s.linear.params().check().unwrap();
        }
    }
}
