//! Figures on real data (../shared/data): the configs reach their documented test P@1.

use crate::{farout, public_data, quiet_in, summary};

/// Test P@1 of `config`, or `None` when the data set `data` is absent (the test is skipped).
fn p_at_1(test: &str, data: &str, config: &str) -> Option<f64> {
    public_data(test, data)?;
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["train".to_string(), config.to_string()];
    args.extend(quiet_in(dir.path()));
    let s = summary(&farout(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    Some(s["metrics"]["p@1"].as_f64().unwrap())
}

/// fastText supervised reaches 0.573 on this split, omikuji 0.637.
#[test]
fn bibtex_margin_reaches_p_at_1_of_0_60() {
    let Some(p) = p_at_1("bibtex_margin_reaches_p_at_1_of_0_60", "xmc/bibtex", "configs/bibtex-margin.toml") else {
        return;
    };
    assert!(p >= 0.60, "bibtex-margin test P@1 = {p}");
}

/// fastText supervised (softmax) reaches 0.607 on this split, omikuji 0.665.
#[test]
fn delicious_margin_reaches_p_at_1_of_0_63() {
    let Some(p) = p_at_1("delicious_margin_reaches_p_at_1_of_0_63", "xmc/delicious", "configs/delicious-margin.toml")
    else {
        return;
    };
    assert!(p >= 0.63, "delicious-margin test P@1 = {p}");
}
