//! A trial's config: the base config with `--set` style settings over it.
//!
//! The settings go into the config file's own tree (so that `best.toml` reads like the file
//! it came from); a setting below a table the file leaves to its defaults (`output.optimizer.lr`
//! with no `[output.optimizer]`) first copies that table, with every default spelled out, from
//! the loaded config, so the setting changes one value and not the table's other keys.

use crate::config::{ConfigError, apply_override};
use crate::{Config, Error};
use std::path::Path;

/// A base config, ready to take settings.
#[derive(Clone, Debug)]
pub struct Recipe {
    /// The config file's tree with the command line's `--set` applied.
    raw: toml::Table,
    /// The loaded config's tree: every key explicit.
    full: toml::Table,
    /// The run's name.
    pub name: String,
}

/// One setting: a config key (dotted path) and its value as TOML.
pub type Setting = (String, String);

impl Recipe {
    /// Reads the config at `path` with the overrides `set`; returns it loaded as well.
    pub fn load(path: &Path, set: &[String]) -> Result<(Self, Config), Error> {
        let config = Config::load(path, set)?;
        let at = |error: ConfigError| Error::Config { path: path.to_path_buf(), error };
        let text = std::fs::read_to_string(path).map_err(crate::io_err(path))?;
        let mut raw: toml::Table = text.parse().map_err(|e: toml::de::Error| at(ConfigError::Syntax(e.to_string())))?;
        for o in set {
            apply_override(&mut raw, o).map_err(at)?;
        }
        let mut full = toml::Table::try_from(&config).expect("a loaded config serialises");
        if config.linear.is_some() {
            // Filled in by the parser for linear configs, refused in their files.
            for section in ["model", "output", "index"] {
                full.remove(section);
            }
        }
        Ok((Self { raw, full, name: config.name.clone() }, config))
    }

    /// The config tree with `settings` applied.
    pub fn table(&self, settings: &[Setting]) -> Result<toml::Table, ConfigError> {
        let mut table = self.raw.clone();
        for (key, value) in settings {
            self.materialise(&mut table, key);
            apply_override(&mut table, &format!("{key}={value}"))?;
        }
        Ok(table)
    }

    /// The checked config with `settings` applied (named as the base).
    pub fn config(&self, settings: &[Setting]) -> Result<Config, ConfigError> {
        let text = toml::to_string(&self.table(settings)?).expect("a config tree serialises");
        let mut config = Config::parse(&text, &[])?;
        config.expand_data_paths();
        if config.name.is_empty() {
            config.name = self.name.clone();
        }
        config.check()?;
        config.limit_threads();
        Ok(config)
    }

    /// Copies from the loaded config the tables above `key` that `table` lacks.
    fn materialise(&self, table: &mut toml::Table, key: &str) {
        let parts: Vec<&str> = key.split('.').collect();
        let (mut cur, mut full) = (table, Some(&self.full));
        for part in &parts[..parts.len().saturating_sub(1)] {
            let from = full.and_then(|f| f.get(*part)).and_then(toml::Value::as_table);
            if !cur.contains_key(*part) {
                cur.insert(part.to_string(), toml::Value::Table(from.cloned().unwrap_or_default()));
            }
            full = from;
            match cur.get_mut(*part).and_then(toml::Value::as_table_mut) {
                Some(next) => cur = next,
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(text: &str) -> Recipe {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.toml");
        std::fs::write(&path, text).unwrap();
        Recipe::load(&path, &[]).unwrap().0
    }

    const DOC: &str = "[data]\nformat = \"synthetic_xmc\"\n[model]\nencoder = \"doc_encoder\"\n\
                       [output]\nestimator = \"softmax\"\n[train]\nepochs = 2\n";

    #[test]
    fn a_setting_under_a_default_table_keeps_the_tables_other_keys() {
        let r = recipe(DOC);
        let c = r.config(&[("output.optimizer.lr".into(), "0.5".into())]).unwrap();
        assert_eq!(c.output.optimizer, farout_layer::OptimizerConfig::Adagrad { lr: 0.5, eps: 1e-8, l2: 0.0 });
        assert_eq!(c.train.epochs, 2);
        assert_eq!(c.name, "base");
    }

    #[test]
    fn a_linear_recipe_takes_solver_and_data_settings() {
        let r = recipe("[data]\nformat = \"synthetic_xmc\"\n[linear]\nsolver = \"dismec\"\n");
        let c = r.config(&[("linear.c".into(), "3.0".into()), ("data.tfidf".into(), "true".into())]).unwrap();
        assert!(c.data.tfidf);
        let Some(farout_linear::SolverConfig::Dismec(d)) = &c.linear else { panic!("{:?}", c.linear) };
        assert_eq!(d.c, 3.0);
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_it() {
        let e = recipe(DOC).config(&[("output.optimizer.rate".into(), "0.5".into())]).unwrap_err();
        assert!(e.to_string().contains("rate"), "{e}");
    }
}
