//! The space a tune searches: the plug-ins' own spaces for the config's task (each declared
//! beside its parameters and `check`), with a space file's ranges over them.
//!
//! A space file names config keys (the `--set` paths) and their ranges, one form per key:
//!
//! ```toml
//! "linear.c" = { log = [0.01, 100.0] }      # log-uniform float
//! "data.tfidf" = { choice = [true, false] }  # one of these values
//! "train.batch_size" = { int_log = [8, 256] } # also: float = [lo, hi], int = [lo, hi]
//! ```
//!
//! A key of the file replaces that key's default range or adds a key; a single choice fixes
//! the key. Every range is checked before the search: its form and bounds, and each end point
//! (every choice) in the config, so a misspelled key or a value the plug-in refuses is an error
//! naming the key.

use super::recipe::Recipe;
use crate::task::TaskKind;
use crate::{Config, Error};
use farout_core::space::{Dim, Range, Value};
use std::path::Path;

/// The default space of `config`'s task: data preprocessing, the solver's or the encoder's,
/// estimator's and optimisers' ranges, each under its section.
pub fn default_space(config: &Config) -> Vec<Dim> {
    let under = |dims: Vec<Dim>, section: &str| dims.into_iter().map(|d| d.under(section)).collect::<Vec<_>>();
    let mut space = under(config.data.search_space(), "data");
    let out = &config.output;
    match TaskKind::of(config) {
        TaskKind::Linear => {
            if let Some(solver) = &config.linear {
                space.extend(under(solver.params().search_space(), "linear"));
            }
        }
        TaskKind::Classifier => {
            if config.model.encoder == crate::config::EncoderKind::DocEncoder {
                space.extend(under(config.model.doc_encoder.search_space(), "model.doc_encoder"));
            }
            space.extend(under(out.optimizer.search_space(), "output.optimizer"));
            space.extend(under(out.estimator.params().search_space(), "output"));
            space.extend(under(config.train.search_space(), "train"));
        }
        TaskKind::SkipGram => {
            space.extend(under(config.model.skip_gram.search_space(), "model.skip_gram"));
            space.extend(under(out.estimator.params().search_space(), "output"));
        }
    }
    space
}

/// `space` with the ranges of the space file `path` over it (see the module docs).
pub fn read_space(path: &Path, mut space: Vec<Dim>) -> Result<Vec<Dim>, Error> {
    let text = std::fs::read_to_string(path).map_err(crate::io_err(path))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| bad(path, one_line(&e.to_string())))?;
    let mut dims = Vec::new();
    flatten(path, &table, "", &mut dims)?;
    for dim in dims {
        match space.iter_mut().find(|d| d.key == dim.key) {
            Some(d) => *d = dim,
            None => space.push(dim),
        }
    }
    Ok(space)
}

/// Checks every range, then tries each end point in the config: an error names the key.
pub fn check_space(space: &[Dim], recipe: &Recipe, origin: &str) -> Result<(), Error> {
    for dim in space {
        dim.check().map_err(|e| Error::Option { name: "space", msg: format!("{origin}: {e}") })?;
        for value in dim.extremes() {
            let setting = vec![(dim.key.to_string(), value.to_string())];
            if let Err(e) = recipe.config(&setting) {
                return Err(Error::Option {
                    name: "space",
                    msg: format!(
                        "{origin}: key `{}` ({}): the config refuses {} = {value}: {e}",
                        dim.key,
                        dim.range.describe(),
                        dim.key
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The forms a key's range can take in a space file.
const FORMS: &str = "log = [lo, hi], float = [lo, hi], int = [lo, hi], int_log = [lo, hi] or choice = [values]";

/// Collects the ranges of `table` (keys under `prefix`): a table whose one key is a range's
/// form is a range, any other table a section.
fn flatten(path: &Path, table: &toml::Table, prefix: &str, dims: &mut Vec<Dim>) -> Result<(), Error> {
    for (k, v) in table {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        let toml::Value::Table(t) = v else {
            return Err(bad(path, format!("key `{key}`: give its range as a table, one of {FORMS}")));
        };
        let is_range = t.keys().any(|f| ["log", "float", "int", "int_log", "choice"].contains(&f.as_str()))
            || t.values().all(|v| !v.is_table());
        if !is_range {
            flatten(path, t, &key, dims)?;
            continue;
        }
        if t.len() != 1 {
            return Err(bad(path, format!("key `{key}`: give exactly one of {FORMS}")));
        }
        let (form, value) = t.iter().next().expect("one entry");
        dims.push(range(path, &key, form, value)?);
    }
    Ok(())
}

/// The range `form = value` of `key`.
fn range(path: &Path, key: &str, form: &str, value: &toml::Value) -> Result<Dim, Error> {
    let items = value.as_array().ok_or_else(|| bad(path, format!("key `{key}`: {form} takes an array")))?;
    if form == "choice" {
        let values = items.iter().map(|v| choice(path, key, v)).collect::<Result<Vec<_>, _>>()?;
        return Ok(Dim::choice(key.to_string(), values));
    }
    let pair = |what: &str| bad(path, format!("key `{key}`: {form} takes [lo, hi], two {what}"));
    let dim = match form {
        "int" | "int_log" => {
            let [lo, hi] = items.as_slice() else { return Err(pair("integers")) };
            let (Some(lo), Some(hi)) = (lo.as_integer(), hi.as_integer()) else { return Err(pair("integers")) };
            Dim::int(key.to_string(), lo, hi, form == "int_log")
        }
        "log" | "float" => {
            let num = |v: &toml::Value| v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
            let [lo, hi] = items.as_slice() else { return Err(pair("numbers")) };
            let (Some(lo), Some(hi)) = (num(lo), num(hi)) else { return Err(pair("numbers")) };
            Dim { key: key.to_string().into(), range: Range::Float { lo, hi, log: form == "log" } }
        }
        _ => return Err(bad(path, format!("key `{key}`: unknown form `{form}`; give one of {FORMS}"))),
    };
    Ok(dim)
}

/// One value of a choice.
fn choice(path: &Path, key: &str, v: &toml::Value) -> Result<Value, Error> {
    Ok(match v {
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Integer(i) => Value::Int(*i),
        toml::Value::Float(f) => Value::Float(*f),
        toml::Value::String(s) => Value::Str(s.clone().into()),
        _ => return Err(bad(path, format!("key `{key}`: a choice is a boolean, number or string"))),
    })
}

fn bad(path: &Path, msg: String) -> Error {
    Error::Option { name: "space", msg: format!("{}: {msg}", path.display()) }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
