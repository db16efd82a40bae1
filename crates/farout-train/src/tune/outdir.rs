//! The output directory of a tune is never one of its inputs: it may not be, nor hold, the
//! config or a data file, nor lie inside the base config's checkpoint directory or its kept
//! best weights (a trial's writes there would replace the base run's model).

use crate::{Config, Error};
use std::path::{Component, Path, PathBuf};

/// An error naming both paths when `out` is, holds or lies in an input of `base` (read from
/// `config_path`).
pub fn check(out: &Path, config_path: &Path, base: &Config) -> Result<(), Error> {
    let out_abs = resolve(out);
    let d = &base.data;
    let e = &base.eval;
    let files = [&d.train, &d.test, &d.train_labels, &d.test_labels, &d.corpus, &e.analogy, &e.similarity, &e.heldout];
    let mut inputs: Vec<(&str, PathBuf)> = vec![("the config", config_path.to_path_buf())];
    inputs.extend(files.into_iter().flatten().map(|p| ("a data file", p.clone())));
    for (what, input) in &inputs {
        let input_abs = resolve(input);
        if input_abs == out_abs || input_abs.starts_with(&out_abs) {
            return Err(refuse(out, &format!("it would hold {what}, {}", input.display())));
        }
    }
    for checkpoints in [base.checkpoint_dir(), base.best_checkpoint_dir()] {
        if resolve(&checkpoints).starts_with(&out_abs) || out_abs.starts_with(resolve(&checkpoints)) {
            return Err(refuse(
                out,
                &format!("it overlaps the base config's checkpoint directory {}", checkpoints.display()),
            ));
        }
    }
    Ok(())
}

fn refuse(out: &Path, why: &str) -> Error {
    Error::Option { name: "out", msg: format!("{}: {why}; choose another directory", out.display()) }
}

/// `path` made absolute, with symbolic links of its existing part resolved and `.` / `..`
/// folded, so that two spellings of one place compare equal.
fn resolve(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut folded = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                folded.pop();
            }
            Component::CurDir => {}
            c => folded.push(c),
        }
    }
    // Resolve links in the longest prefix that exists.
    let mut existing = folded.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match existing.file_name() {
            Some(name) => rest.push(name.to_os_string()),
            None => break,
        }
        existing.pop();
    }
    let mut resolved = existing.canonicalize().unwrap_or(existing);
    resolved.extend(rest.iter().rev());
    resolved
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_onto_the_config_data_or_checkpoints_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let train = data.join("train.txt");
        std::fs::write(&train, "").unwrap();
        let config_path = dir.path().join("c.toml");
        let mut c = Config::parse(
            "[data]\nformat = \"xmc\"\n[model]\nencoder = \"doc_encoder\"\n[output]\nestimator = \"softmax\"\n",
            &[],
        )
        .unwrap();
        c.data.train = Some(train.clone());
        c.checkpoint.dir = Some(dir.path().join("ckpt"));
        for out in [
            data.clone(),
            data.join("..").join("data"),
            train.clone(),
            dir.path().to_path_buf(),
            dir.path().join("ckpt/x"),
        ] {
            let e = check(&out, &config_path, &c).unwrap_err().to_string();
            assert!(e.starts_with("--out"), "{e}");
        }
        check(&dir.path().join("tune"), &config_path, &c).unwrap();
    }
}
