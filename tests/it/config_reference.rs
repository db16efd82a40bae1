//! docs/config.md's configuration reference against the config types.
//!
//! Its section "Configuration reference" holds one table per config section (`### [train]`),
//! per estimator (`### [output] with estimator = "ldgs"`), per index and per optimiser kind,
//! with the columns key (a `--set` path), default, allowed values and meaning. A default is a
//! TOML literal in backticks, or `required`, or `unset` (an optional key), or words (derived
//! from something else, such as the run name). Backticked TOML values in the allowed column are
//! allowed values.
//!
//! For every row, on a minimal config of the right kind (the heading's estimator, index or
//! optimiser selected, the table's required keys given):
//! - `--set key=default` loads and gives the same config as leaving the key out, so the documented
//!   default is the code's (`required`, `unset` and derived keys load with their first allowed
//!   value; `unset` keys are absent from the default config);
//! - the key with a misspelled last segment is rejected;
//! - every allowed value parses, and where the key is an enum, the allowed strings are exactly
//!   the variants the parser lists.
//!
//! In the other direction, the default config with each registered estimator, each registered
//! index and each optimiser kind is serialized, and its keys must be exactly the documented keys of
//! the tables that apply to it. A key added, removed or renamed in the code, a changed default or
//! a new enum variant fails here until docs/config.md follows.

use farout_train::Config;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const MINIMAL: &str =
    "[data]\nformat = \"synthetic_face\"\n[model]\nencoder = \"face_head\"\n[output]\nestimator = \"softmax\"\n";

/// The minimal linear config (a `[linear]` config has no `[model]` or `[output]`).
const MINIMAL_LINEAR: &str = "[data]\nformat = \"synthetic_xmc\"\n[linear]\nsolver = \"dismec\"\n";

/// The minimal config `sets` apply to: the linear one when they set a `linear.` key.
fn minimal(sets: &[String]) -> &'static str {
    if sets.iter().any(|s| s.starts_with("linear.")) { MINIMAL_LINEAR } else { MINIMAL }
}

/// A value of `--set` that no enum takes.
const NOT_A_VARIANT: &str = "\"no_such_value\"";

#[derive(Debug)]
enum Default {
    /// A TOML literal.
    Literal(String),
    /// The key must be given.
    Required,
    /// An optional key, absent by default.
    Unset,
    /// Derived from something else (words, no literal).
    Derived,
}

#[derive(Debug)]
struct Row {
    key: String,
    default: Default,
    /// Backticked TOML values of the allowed column.
    allowed: Vec<String>,
    line: usize,
}

#[derive(Debug)]
struct Table {
    heading: String,
    /// `output`, `index`, `data.face`; empty for the top level.
    section: String,
    /// The selecting key (`output.estimator`, `index.kind`, `output.optimizer.kind`) and the
    /// values of the heading.
    selector: Option<(String, Vec<String>)>,
    rows: Vec<Row>,
}

impl Table {
    fn selects(&self, config: &toml::Value) -> bool {
        match &self.selector {
            None => true,
            Some((path, values)) => {
                lookup(config, path).and_then(|v| v.as_str()).is_some_and(|v| values.iter().any(|s| s == v))
            }
        }
    }
}

/// The file that holds the reference, relative to the project root.
const REFERENCE: &str = "docs/config.md";

fn reference() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(REFERENCE)).unwrap()
}

/// The backticked pieces of `s`.
fn backticked(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

/// The double-quoted strings of `s`.
fn quoted(s: &str) -> Vec<String> {
    s.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

/// Whether `s` is a TOML value.
fn is_toml_value(s: &str) -> bool {
    format!("v = {s}").parse::<toml::Table>().is_ok()
}

fn parse_reference(text: &str) -> Vec<Table> {
    let mut tables: Vec<Table> = Vec::new();
    let mut inside = false;
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("## ") {
            inside = line == "## Configuration reference";
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(heading) = line.strip_prefix("### ") {
            let section = heading
                .split_once("`[")
                .and_then(|(_, rest)| rest.split_once("]`"))
                .map(|(s, _)| s.to_string())
                .unwrap_or_default();
            let selector = [
                ("estimator = ", "output.estimator".to_string()),
                ("kind = ", format!("{section}.kind")),
                ("solver = ", "linear.solver".to_string()),
            ]
            .into_iter()
            .find_map(|(marker, path)| heading.split_once(marker).map(|(_, rest)| (path, quoted(rest))));
            tables.push(Table { heading: heading.to_string(), section, selector, rows: Vec::new() });
            continue;
        }
        let Some(body) = line.strip_prefix('|') else { continue };
        let cells: Vec<&str> = body.trim_end().trim_end_matches('|').split('|').map(str::trim).collect();
        if cells[0] == "key" || cells[0].starts_with("---") {
            continue;
        }
        assert_eq!(cells.len(), 4, "{REFERENCE}:{}: a reference row has 4 cells: {line}", i + 1);
        let table = tables.last_mut().unwrap_or_else(|| panic!("{REFERENCE}:{}: a row before any heading", i + 1));
        let key = cells[0].trim_matches('`').to_string();
        let default = if cells[1].starts_with('`') {
            Default::Literal(backticked(cells[1])[0].to_string())
        } else if cells[1].starts_with("required") {
            Default::Required
        } else if cells[1].starts_with("unset") {
            Default::Unset
        } else {
            Default::Derived
        };
        let allowed = backticked(cells[2]).into_iter().filter(|s| is_toml_value(s)).map(str::to_string).collect();
        table.rows.push(Row { key, default, allowed, line: i + 1 });
    }
    tables
}

/// `value` at the dotted `path`.
fn lookup<'a>(value: &'a toml::Value, path: &str) -> Option<&'a toml::Value> {
    path.split('.').try_fold(value, |v, k| v.get(k))
}

/// The dotted paths of the leaves (non-table values) of `value`.
fn leaves(value: &toml::Value) -> BTreeSet<String> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut BTreeSet<String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(&path, v, out);
                }
            }
            _ => {
                out.insert(prefix.to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk("", value, &mut out);
    out
}

fn serialized(c: &Config) -> toml::Value {
    toml::Value::try_from(c).expect("the config serializes")
}

/// Loads the minimal config (a file in `dir`, linear or not, see [`minimal`]) with `sets` as
/// `--set` arguments.
fn load(dir: &Path, sets: &[String]) -> Result<Config, String> {
    let file = if minimal(sets) == MINIMAL_LINEAR { "minimal-linear.toml" } else { "minimal.toml" };
    Config::load(&dir.join(file), sets).map_err(|e| e.to_string())
}

/// The config a table's keys are tried on: the data and model its section needs, the heading's
/// selection `value`, and the table's required keys at their first allowed value.
fn context(table: &Table, value: Option<&str>) -> Vec<String> {
    let s = table.section.as_str();
    let mut sets: Vec<String> = if ["data.text", "data.synthetic", "model.skip_gram"].contains(&s) {
        vec!["data.format=\"text\"".into(), "model.encoder=\"skip_gram\"".into()]
    } else if ["data.xmc", "model.doc_encoder"].contains(&s) {
        vec!["data.format=\"synthetic_xmc\"".into(), "model.encoder=\"doc_encoder\"".into()]
    } else if s == "data" {
        vec!["data.format=\"xmc\"".into(), "data.train=\"train.txt\"".into(), "model.encoder=\"doc_encoder\"".into()]
    } else {
        Vec::new()
    };
    if let (Some((path, _)), Some(value)) = (&table.selector, value) {
        sets.push(format!("{path}=\"{value}\""));
        if path == "output.estimator" && ["mips", "ldgs"].contains(&value) {
            sets.push("output.layer.bias=false".into());
        }
    }
    for row in &table.rows {
        if let Default::Required = row.default {
            let example = row
                .allowed
                .first()
                .unwrap_or_else(|| panic!("{REFERENCE}:{}: a required key needs an example", row.line));
            sets.push(format!("{}={example}", row.key));
        }
    }
    sets
}

/// The variants an enum key lists when given a value it does not take (`None`: not an enum).
fn variants(error: &str) -> Option<BTreeSet<String>> {
    let (_, rest) = error.split_once("unknown variant")?;
    let (_, expected) = rest.split_once("expected")?;
    // serde's list: "`a`", "`a` or `b`", "one of `a`, `b`, `c`"; whatever follows it is not.
    let mut names = BTreeSet::new();
    let mut pieces = expected.split('`');
    while let (Some(gap), Some(name)) = (pieces.next(), pieces.next()) {
        let gap = gap.trim().trim_start_matches("one of").trim_matches(|c: char| c == ',' || c.is_whitespace());
        if !(gap.is_empty() || gap == "or") || (names.is_empty() && gap == "or") {
            break;
        }
        names.insert(name.to_string());
    }
    Some(names)
}

fn with(sets: &[String], extra: String) -> Vec<String> {
    let mut all = sets.to_vec();
    all.push(extra);
    all
}

/// The minimal config in a fresh directory.
fn minimal_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("minimal.toml"), MINIMAL).unwrap();
    std::fs::write(dir.path().join("minimal-linear.toml"), MINIMAL_LINEAR).unwrap();
    let path = dir.path().to_path_buf();
    (dir, path)
}

#[test]
fn every_documented_key_loads_with_its_documented_default() {
    let tables = parse_reference(&reference());
    let rows: usize = tables.iter().map(|t| t.rows.len()).sum();
    assert!(rows >= 100 && tables.len() >= 20, "the reference has {} tables and {rows} rows", tables.len());
    let (_guard, dir) = minimal_dir();
    let defaults = leaves(&serialized(&load(&dir, &[]).unwrap()));
    let mut problems = Vec::new();
    for table in &tables {
        assert!(!table.rows.is_empty(), "{REFERENCE} heading `{}` has no table", table.heading);
        let values: Vec<Option<&str>> = match &table.selector {
            Some((_, values)) => values.iter().map(|v| Some(v.as_str())).collect(),
            None => vec![None],
        };
        for value in values {
            let ctx = context(table, value);
            let base = load(&dir, &ctx).unwrap_or_else(|e| panic!("`{}` with {ctx:?}: {e}", table.heading));
            for row in &table.rows {
                let at = format!("{REFERENCE}:{} `{}` ({})", row.line, row.key, table.heading);
                let value = match &row.default {
                    Default::Literal(v) => v.clone(),
                    _ => match row.allowed.first() {
                        Some(v) => v.clone(),
                        None => {
                            problems.push(format!("{at}: no backticked allowed value to try"));
                            continue;
                        }
                    },
                };
                match load(&dir, &with(&ctx, format!("{}={value}", row.key))) {
                    Err(e) => problems.push(format!("{at}: `--set {}={value}` is rejected: {e}", row.key)),
                    Ok(c) => match &row.default {
                        Default::Literal(_) if c != base => {
                            problems.push(format!("{at}: the default is not `{value}`"));
                        }
                        Default::Unset if defaults.contains(&row.key) => {
                            problems.push(format!("{at}: documented as unset but set by default"));
                        }
                        Default::Unset if !leaves(&serialized(&c)).contains(&row.key) => {
                            problems.push(format!("{at}: setting it leaves no such key in the config"));
                        }
                        _ => {}
                    },
                }
                let (parent, last) = row.key.rsplit_once('.').map_or(("", row.key.as_str()), |(p, l)| (p, l));
                let typo = if parent.is_empty() { format!("{last}_typo") } else { format!("{parent}.{last}_typo") };
                if load(&dir, &with(&ctx, format!("{typo}={value}"))).is_ok() {
                    problems.push(format!("{at}: the misspelled key `{typo}` is accepted"));
                }
                for a in &row.allowed {
                    let sets = with(&ctx, format!("{}={a}", row.key));
                    if let Err(e) = Config::parse(minimal(&sets), &sets) {
                        problems.push(format!("{at}: the allowed value `{a}` is rejected: {e}"));
                    }
                }
                let strings: BTreeSet<String> = row
                    .allowed
                    .iter()
                    .filter_map(|a| a.strip_prefix('"').and_then(|a| a.strip_suffix('"')))
                    .map(str::to_string)
                    .collect();
                let not_a_variant = with(&ctx, format!("{}={NOT_A_VARIANT}", row.key));
                if let Err(e) = Config::parse(minimal(&not_a_variant), &not_a_variant)
                    && let Some(variants) = variants(&e.to_string())
                    && variants != strings
                {
                    problems.push(format!("{at}: allowed values {strings:?}, the code takes {variants:?}"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{REFERENCE}'s configuration reference is out of date:\n{}", problems.join("\n"));
}

#[test]
fn every_key_of_the_config_types_is_documented() {
    let tables = parse_reference(&reference());
    let keys: BTreeSet<&str> = tables.iter().flat_map(|t| t.rows.iter().map(|r| r.key.as_str())).collect();
    let selectors: BTreeSet<&str> =
        tables.iter().filter_map(|t| t.selector.as_ref().map(|(p, _)| p.as_str())).collect();
    // A row documents a whole table (`model.doc_encoder.optimizer`) unless rows document its keys.
    let has_deeper =
        |k: &str| keys.iter().any(|o| o.len() > k.len() && o.starts_with(k) && o[k.len()..].starts_with('.'));

    // Every estimator, every index and every optimiser kind of the code.
    let mut contexts: Vec<Vec<String>> = Vec::new();
    for e in farout_estimators::EstimatorConfig::NAMES {
        contexts.push(vec![format!("output.estimator=\"{e}\"")]);
    }
    for i in farout_search::IndexConfig::NAMES {
        contexts.push(vec![format!("index.kind=\"{i}\"")]);
    }
    for s in farout_linear::SolverConfig::NAMES {
        contexts.push(vec![format!("linear.solver=\"{s}\"")]);
    }
    let e = Config::parse(MINIMAL, &[format!("output.optimizer.kind={NOT_A_VARIANT}")]).unwrap_err().to_string();
    let kinds = variants(&e).unwrap_or_else(|| panic!("the optimiser kinds are not listed in: {e}"));
    assert!(kinds.len() >= 3, "{kinds:?}");
    for kind in &kinds {
        let mut sets = vec![format!("output.optimizer.kind=\"{kind}\"")];
        let documented = tables
            .iter()
            .find(|t| t.selector.as_ref().is_some_and(|(p, v)| p == "output.optimizer.kind" && v.contains(kind)));
        match documented {
            Some(t) => {
                sets.extend(context(t, Some(kind)).into_iter().filter(|s| !s.starts_with("output.optimizer.kind=")))
            }
            None => panic!("{REFERENCE} documents no `[output.optimizer]` with `kind = \"{kind}\"`"),
        }
        contexts.push(sets);
    }

    let mut problems = Vec::new();
    for sets in contexts {
        let c = Config::parse(minimal(&sets), &sets).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
        let tree = serialized(&c);
        let found: BTreeSet<String> = leaves(&tree)
            .into_iter()
            .map(|leaf| {
                if keys.contains(leaf.as_str()) || selectors.contains(leaf.as_str()) {
                    return leaf;
                }
                let covering =
                    keys.iter().find(|k| leaf.starts_with(*k) && leaf[k.len()..].starts_with('.') && !has_deeper(k));
                covering.map_or(leaf, |k| k.to_string())
            })
            .collect();
        let applying: Vec<&Table> = tables.iter().filter(|t| t.selects(&tree)).collect();
        let documented: BTreeSet<String> = applying
            .iter()
            .flat_map(|t| t.rows.iter())
            .filter(|r| !matches!(r.default, Default::Unset) && !has_deeper(&r.key))
            .map(|r| r.key.clone())
            .chain(applying.iter().filter_map(|t| t.selector.as_ref().map(|(p, _)| p.clone())))
            .collect();
        for k in found.difference(&documented) {
            problems.push(format!("{sets:?}: `{k}` is a key of the config but not in {REFERENCE}'s reference"));
        }
        for k in documented.difference(&found) {
            problems.push(format!("{sets:?}: {REFERENCE} documents `{k}`, which the config does not have"));
        }
    }
    assert!(problems.is_empty(), "{REFERENCE}'s configuration reference is out of date:\n{}", problems.join("\n"));
}
