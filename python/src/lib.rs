//! The `farout` Python package's native module, `farout._farout`: thin bindings of farout's
//! library crates. The package's public API is the Python of `python/farout/`, which checks
//! and converts arguments (dtypes, sparse matrices, label lists) and calls these functions.
//!
//! Everywhere: the GIL is released while farout computes, errors become `farout.FaroutError`s
//! with the CLI's message ([`errors`]), and a Rust panic never crosses into Python (PyO3 turns
//! one into `pyo3_runtime.PanicException`; the checks before every call keep farout's own
//! panics unreachable).

mod arrays;
mod errors;
mod index;
mod layer;
mod linear;
mod runs;
mod vectors;

use pyo3::prelude::*;

/// Sets which of farout's log records reach standard error: `"warning"` (the default),
/// `"info"` (what the CLI prints: runs starting, checkpoints saved) or `"off"`.
#[pyfunction]
fn set_verbosity(level: &str) -> PyResult<()> {
    let filter = match level {
        "off" => log::LevelFilter::Off,
        "warning" => log::LevelFilter::Warn,
        "info" => log::LevelFilter::Info,
        other => {
            return Err(errors::invalid(format!("verbosity {other:?}: allowed are \"off\", \"warning\", \"info\"")));
        }
    };
    log::set_max_level(filter);
    Ok(())
}

#[pymodule]
fn _farout(m: &Bound<'_, PyModule>) -> PyResult<()> {
    farout_train::report::StderrLogger::install(log::LevelFilter::Info);
    log::set_max_level(log::LevelFilter::Warn);
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(set_verbosity, m)?)?;
    m.add_function(wrap_pyfunction!(runs::train, m)?)?;
    m.add_function(wrap_pyfunction!(runs::evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(runs::compare, m)?)?;
    m.add_function(wrap_pyfunction!(runs::toml_text, m)?)?;
    m.add_class::<linear::LinearModel>()?;
    m.add_function(wrap_pyfunction!(linear::linear_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(linear::fit_linear, m)?)?;
    m.add_function(wrap_pyfunction!(linear::fit_idf, m)?)?;
    m.add_function(wrap_pyfunction!(linear::transform, m)?)?;
    m.add_function(wrap_pyfunction!(linear::read_xmc, m)?)?;
    m.add_class::<layer::OutputLayer>()?;
    m.add_class::<index::NativeIndex>()?;
    m.add_class::<vectors::NativeVectors>()?;
    m.add_function(wrap_pyfunction!(vectors::train_word_vectors, m)?)?;
    Ok(())
}
