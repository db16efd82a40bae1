//! Search spaces: the ranges over which `farout tune` draws a plug-in's parameters.
//!
//! Each plug-in declares its space beside its parameters and `check` (a [`Dim`] per key, the
//! key relative to the plug-in's section as in its [`crate::ParamError`]s); the config reader
//! prefixes the section ([`Dim::under`]), so a drawn value is a `--set key=value` override of
//! the base config. A parameter that is a scale (a learning rate, a regularisation weight) is
//! drawn log-uniformly: `exp(U(ln lo, ln hi))`, so that each decade gets the same share of
//! the draws.
//!
//! ```
//! use farout_core::space::{Dim, Value};
//! let d = Dim::float_log("c", 0.1, 10.0).under("linear");
//! assert_eq!(d.key, "linear.c");
//! let mut rng = farout_core::rng::seeded(1, 0);
//! let Value::Float(c) = d.draw(&mut rng) else { unreachable!() };
//! assert!((0.1..=10.0).contains(&c));
//! ```

use crate::ParamError;
use crate::rng::{Rng, RngExt};
use std::borrow::Cow;
use std::fmt;

/// A value of a config key, written as TOML in a `--set` override ([`fmt::Display`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (an enum's name).
    Str(Cow<'static, str>),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            // `{:?}` keeps a decimal point (1.0, not 1), so TOML reads a float back.
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Str(s) => write!(f, "\"{}\"", s.escape_default()),
        }
    }
}

/// The values a key can take.
#[derive(Clone, Debug, PartialEq)]
pub enum Range {
    /// A float in `[lo, hi]`, log-uniform when `log`.
    Float {
        /// Smallest value.
        lo: f64,
        /// Largest value.
        hi: f64,
        /// Draw `ln x` uniformly (needs `lo > 0`).
        log: bool,
    },
    /// An integer in `[lo, hi]`, log-uniform (then rounded) when `log`.
    Int {
        /// Smallest value.
        lo: i64,
        /// Largest value.
        hi: i64,
        /// Draw `ln x` uniformly (needs `lo > 0`).
        log: bool,
    },
    /// One of these values, each as likely.
    Choice(Vec<Value>),
}

/// One dimension of a search space: a config key and its range.
#[derive(Clone, Debug, PartialEq)]
pub struct Dim {
    /// The key, relative to the plug-in's section until [`Dim::under`] prefixes it.
    pub key: Cow<'static, str>,
    /// Its values.
    pub range: Range,
}

impl Dim {
    /// A float key drawn log-uniformly from `[lo, hi]` (a scale: learning rate, C, λ).
    pub fn float_log(key: impl Into<Cow<'static, str>>, lo: f64, hi: f64) -> Self {
        Self { key: key.into(), range: Range::Float { lo, hi, log: true } }
    }

    /// A float key drawn uniformly from `[lo, hi]`.
    pub fn float(key: impl Into<Cow<'static, str>>, lo: f64, hi: f64) -> Self {
        Self { key: key.into(), range: Range::Float { lo, hi, log: false } }
    }

    /// An integer key drawn from `[lo, hi]`, log-uniformly when `log`.
    pub fn int(key: impl Into<Cow<'static, str>>, lo: i64, hi: i64, log: bool) -> Self {
        Self { key: key.into(), range: Range::Int { lo, hi, log } }
    }

    /// A key taking one of `values`.
    pub fn choice(key: impl Into<Cow<'static, str>>, values: Vec<Value>) -> Self {
        Self { key: key.into(), range: Range::Choice(values) }
    }

    /// The same dimension with its key under `section` (`c` under `linear` is `linear.c`).
    pub fn under(mut self, section: &str) -> Self {
        self.key = format!("{section}.{}", self.key).into();
        self
    }

    /// Checks the range: finite bounds with `lo <= hi`, `lo > 0` on a log scale, at least one
    /// choice. The error names the key.
    pub fn check(&self) -> Result<(), ParamError> {
        let bad = |why: &'static str| Err(ParamError::new(self.key.clone(), self.range.describe(), why));
        match &self.range {
            Range::Float { lo, hi, .. } if !(lo.is_finite() && hi.is_finite()) => bad("bounds must be finite"),
            Range::Float { lo, hi, .. } if lo > hi => bad("needs lo <= hi"),
            Range::Float { lo, log: true, .. } if *lo <= 0.0 => bad("a log-scale range needs lo > 0"),
            Range::Int { lo, hi, .. } if lo > hi => bad("needs lo <= hi"),
            Range::Int { lo, log: true, .. } if *lo <= 0 => bad("a log-scale range needs lo > 0"),
            Range::Choice(v) if v.is_empty() => bad("needs at least one value"),
            Range::Choice(v) if v.iter().any(|x| matches!(x, Value::Float(f) if !f.is_finite())) => {
                bad("values must be finite")
            }
            _ => Ok(()),
        }
    }

    /// A value drawn from the range (checked ranges only).
    pub fn draw(&self, rng: &mut Rng) -> Value {
        match &self.range {
            Range::Float { lo, hi, log } => Value::Float(significant(between(*lo, *hi, *log, rng)).clamp(*lo, *hi)),
            Range::Int { lo, hi, log } => {
                let x = between(*lo as f64, *hi as f64 + if *log { 0.0 } else { 1.0 }, *log, rng);
                let x = if *log { x.round() } else { x.floor() };
                Value::Int((x as i64).clamp(*lo, *hi))
            }
            Range::Choice(values) => values[rng.random_range(0..values.len())].clone(),
        }
    }

    /// The range's end points (every choice, for a choice): what a space's check tries in a
    /// config, so that a range the plug-in's own check refuses is refused before the search.
    pub fn extremes(&self) -> Vec<Value> {
        match &self.range {
            Range::Float { lo, hi, .. } => vec![Value::Float(*lo), Value::Float(*hi)],
            Range::Int { lo, hi, .. } => vec![Value::Int(*lo), Value::Int(*hi)],
            Range::Choice(values) => values.clone(),
        }
    }
}

impl Range {
    /// The range as a space file writes it (`log = [0.1, 10.0]`, `int = [1, 20]`, ...).
    pub fn describe(&self) -> String {
        match self {
            Range::Float { lo, hi, log } => format!("{} = [{lo:?}, {hi:?}]", if *log { "log" } else { "float" }),
            Range::Int { lo, hi, log } => format!("{} = [{lo}, {hi}]", if *log { "int_log" } else { "int" }),
            Range::Choice(v) => {
                format!("choice = [{}]", v.iter().map(Value::to_string).collect::<Vec<_>>().join(", "))
            }
        }
    }
}

/// Significant digits a drawn float keeps: finer steps than 0.1 % of a value change no recipe,
/// and short values keep trials.csv and best.toml readable.
const SIGNIFICANT_DIGITS: i32 = 3;

/// `x` rounded to [`SIGNIFICANT_DIGITS`] significant digits.
fn significant(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(SIGNIFICANT_DIGITS - 1 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// `U(lo, hi)`, or `exp(U(ln lo, ln hi))` when `log`.
fn between(lo: f64, hi: f64, log: bool, rng: &mut Rng) -> f64 {
    let u: f64 = rng.random();
    if log { (lo.ln() + u * (hi.ln() - lo.ln())).exp().clamp(lo, hi) } else { lo + u * (hi - lo) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::seeded;

    #[test]
    fn log_draws_cover_each_decade_alike_and_stay_in_range() {
        let d = Dim::float_log("lr", 1e-3, 1e-1);
        let mut rng = seeded(3, 0);
        let draws: Vec<f64> =
            (0..4000).map(|_| if let Value::Float(x) = d.draw(&mut rng) { x } else { unreachable!() }).collect();
        assert!(draws.iter().all(|x| (1e-3..=1e-1).contains(x)));
        let low = draws.iter().filter(|&&x| x < 1e-2).count() as f64 / draws.len() as f64;
        assert!((low - 0.5).abs() < 0.05, "share below 1e-2: {low}");
    }

    #[test]
    fn int_draws_reach_both_ends() {
        let d = Dim::int("window", 2, 4, false);
        let mut rng = seeded(1, 0);
        let seen: std::collections::BTreeSet<i64> =
            (0..200).map(|_| if let Value::Int(x) = d.draw(&mut rng) { x } else { unreachable!() }).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![2, 3, 4]);
    }

    #[test]
    fn bad_ranges_are_refused_naming_the_key() {
        for d in [
            Dim::float_log("linear.c", 0.0, 1.0),
            Dim::float("x", 2.0, 1.0),
            Dim::float("x", f64::NAN, 1.0),
            Dim::int("n", 0, 5, true),
            Dim::choice("k", vec![]),
        ] {
            let e = d.check().unwrap_err();
            assert_eq!(e.name, d.key, "{e}");
        }
        Dim::float_log("linear.c", 0.1, 10.0).check().unwrap();
    }

    #[test]
    fn drawn_floats_keep_three_significant_digits() {
        let d = Dim::float_log("c", 0.1, 10.0);
        let mut rng = seeded(2, 0);
        for _ in 0..100 {
            let Value::Float(x) = d.draw(&mut rng) else { unreachable!() };
            assert!(x.to_string().trim_start_matches("0.").trim_start_matches('0').len() <= 4, "{x}");
        }
        assert_eq!(significant(0.2985097503262255), 0.299);
        assert_eq!(significant(1234.5), 1230.0);
    }

    #[test]
    fn values_print_as_toml() {
        assert_eq!(Value::Float(1.0).to_string(), "1.0");
        assert_eq!(Value::Str("tfidf".into()).to_string(), "\"tfidf\"");
        assert_eq!(Value::Bool(false).to_string(), "false");
    }
}
