//! Parameters of DiSMEC, as they will appear under `[linear] solver = "dismec"`.
//!
//! A plain serde struct with explicit defaults (those of \[M\] Sect. 5 and LIBLINEAR);
//! [`DismecConfig::check`] names the offending key and the allowed values, and
//! [`crate::Dismec::new`] checks once so the solver never sees an invalid value.
//!
//! ```toml
//! c = 1.0               # loss weight C (the paper has none, i.e. C = 1)
//! eps0 = 0.01           # stopping tolerance of eq. 13 (1 for dense features, [M] Sect. 5)
//! max_iter = 1000       # Newton iterations per label
//! bias = true           # implicit constant feature x_0 = 1 with a regularised weight
//! prune_threshold = 0.01
//! init = "msi"          # "zero" | "bias" | "msi"
//! bias_init = 1.0       # lambda of the bias initialiser -lambda e_0
//! msi_s = 1.0           # MSI target margin of the positive mean (eq. 21)
//! msi_t = -2.0          # MSI target margin of the negative mean
//! ```

use crate::init::{Bias, Msi, WeightInit, Zero};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// Which initial weights the Newton solver starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InitKind {
    /// w = 0 (LIBLINEAR's and DiSMEC's default).
    Zero,
    /// w = −λ e_0: every sample starts on the negative side (\[M\] Sect. 3).
    Bias,
    /// Mean-separating initialisation (\[M\] Sect. 4, eqs. 21–24).
    #[default]
    Msi,
}

/// DiSMEC parameters (see the module docs for the TOML form and defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DismecConfig {
    /// Loss weight C of `½‖w‖² + C Σ φ(y_i wᵀx_i)`; \[M\] fixes C = 1.
    pub c: f64,
    /// ε0 of the stopping rule `‖g‖ ≤ ε0 · max(1, min(|P|,|N|))/n · ‖g(0)‖` (eqs. 12–13).
    pub eps0: f64,
    /// Maximum number of Newton iterations per label.
    pub max_iter: usize,
    /// Whether to add the constant feature x_0 = 1 (an ordinary, regularised weight).
    pub bias: bool,
    /// Weights with |w| below this are set to zero after training (\[M\] Sect. 5: 0.01).
    pub prune_threshold: f64,
    /// Initial weights.
    pub init: InitKind,
    /// λ of the bias initialiser `λ w_b`, `w_b = −e_0` (\[M\] tries 0.9, 1 and 2).
    pub bias_init: f64,
    /// MSI: target score s of the positive mean (eq. 21).
    pub msi_s: f64,
    /// MSI: target score t of the negative mean (eq. 21; −2 for squared hinge, −3 for logistic).
    pub msi_t: f64,
}

impl Default for DismecConfig {
    fn default() -> Self {
        Self {
            c: 1.0,
            eps0: 0.01,
            max_iter: 1000,
            bias: true,
            prune_threshold: 0.01,
            init: InitKind::Msi,
            bias_init: 1.0,
            msi_s: 1.0,
            msi_t: -2.0,
        }
    }
}

fn bad(key: &'static str, found: impl std::fmt::Display, allowed: &'static str) -> Error {
    Error::Config { key, found: found.to_string(), allowed }
}

impl DismecConfig {
    /// Checks every value; the error names the key (`linear.c`) and what is allowed.
    pub fn check(&self) -> Result<()> {
        if !(self.c > 0.0 && self.c.is_finite()) {
            return Err(bad("linear.c", self.c, "a finite number > 0"));
        }
        if !(self.eps0 > 0.0 && self.eps0.is_finite()) {
            return Err(bad("linear.eps0", self.eps0, "a finite number > 0 (0.01 for sparse, 1 for dense features)"));
        }
        if self.max_iter == 0 {
            return Err(bad("linear.max_iter", self.max_iter, "an integer >= 1"));
        }
        if !(self.prune_threshold >= 0.0 && self.prune_threshold.is_finite()) {
            return Err(bad(
                "linear.prune_threshold",
                self.prune_threshold,
                "a finite number >= 0 (0 keeps every weight)",
            ));
        }
        match self.init {
            InitKind::Zero => {}
            InitKind::Bias => {
                if !self.bias {
                    return Err(bad(
                        "linear.init",
                        "\"bias\" with bias = false",
                        "\"zero\" or \"msi\" when bias = false",
                    ));
                }
                if !(self.bias_init > 0.0 && self.bias_init.is_finite()) {
                    return Err(bad("linear.bias_init", self.bias_init, "a finite number > 0 (0.9, 1 or 2 in [M])"));
                }
            }
            InitKind::Msi => {
                if !self.msi_s.is_finite() {
                    return Err(bad("linear.msi_s", self.msi_s, "a finite number greater than msi_t"));
                }
                if !(self.msi_t.is_finite() && self.msi_t < self.msi_s) {
                    return Err(bad("linear.msi_t", self.msi_t, "a finite number less than msi_s (-2 in [M])"));
                }
            }
        }
        Ok(())
    }

    /// The initialiser this config selects.
    pub fn weight_init(&self) -> Box<dyn WeightInit> {
        match self.init {
            InitKind::Zero => Box::new(Zero),
            InitKind::Bias => Box::new(Bias { lambda: self.bias_init }),
            InitKind::Msi => Box::new(Msi { s: self.msi_s, t: self.msi_t }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers_and_an_empty_table_gives_them() {
        let c: DismecConfig = toml::from_str("").unwrap();
        assert_eq!(c, DismecConfig::default());
        assert_eq!((c.c, c.eps0, c.max_iter, c.prune_threshold), (1.0, 0.01, 1000, 0.01));
        assert_eq!((c.msi_s, c.msi_t, c.init), (1.0, -2.0, InitKind::Msi));
        c.check().unwrap();
    }

    #[test]
    fn unknown_keys_and_unknown_inits_are_rejected() {
        assert!(toml::from_str::<DismecConfig>("cee = 1.0").is_err());
        assert!(toml::from_str::<DismecConfig>("init = \"ovap\"").is_err());
        let c: DismecConfig = toml::from_str("init = \"zero\"\neps0 = 0.1").unwrap();
        assert_eq!((c.init, c.eps0), (InitKind::Zero, 0.1));
    }

    #[test]
    fn check_names_the_key_and_the_allowed_values() {
        let cases: [(DismecConfig, &str); 6] = [
            (DismecConfig { c: 0.0, ..Default::default() }, "`linear.c` = 0: allowed values are a finite number > 0"),
            (DismecConfig { eps0: f64::NAN, ..Default::default() }, "`linear.eps0` = NaN"),
            (DismecConfig { max_iter: 0, ..Default::default() }, "`linear.max_iter` = 0"),
            (DismecConfig { prune_threshold: -1.0, ..Default::default() }, "`linear.prune_threshold` = -1"),
            (DismecConfig { init: InitKind::Bias, bias: false, ..Default::default() }, "`linear.init`"),
            (DismecConfig { msi_t: 2.0, ..Default::default() }, "`linear.msi_t` = 2"),
        ];
        for (c, expect) in cases {
            let msg = c.check().unwrap_err().to_string();
            assert!(msg.contains(expect), "{msg:?} should contain {expect:?}");
        }
    }
}
