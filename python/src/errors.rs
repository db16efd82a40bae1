//! farout's errors as Python exceptions: the classes of `farout/_errors.py`, chosen by what
//! went wrong, with the message the CLI prints.
//!
//! - `farout.FileError` (a `FaroutError` and an `OSError`): a file could not be read or written;
//! - `farout.InvalidInput` (a `FaroutError` and a `ValueError`): everything else a caller can fix
//!   (config keys, data, shapes, labels, NaN);
//! - `KeyboardInterrupt`: a run stopped by Ctrl-C (with its checkpoint saved), or a linear fit
//!   (no model kept).

use pyo3::exceptions::{PyKeyboardInterrupt, PyValueError};
use pyo3::prelude::*;
use std::error::Error as StdError;

/// The Python exception for a farout error `e`.
pub fn to_py(e: &(dyn StdError + 'static)) -> PyErr {
    let message = e.to_string();
    if is_interrupt(e) {
        return PyKeyboardInterrupt::new_err(message);
    }
    let class = if io_error(e).is_some() { "FileError" } else { "InvalidInput" };
    raise(class, message)
}

/// `farout.InvalidInput(message)`: bad input found by the bindings themselves.
pub fn invalid(message: impl Into<String>) -> PyErr {
    raise("InvalidInput", message.into())
}

/// An exception of class `class` of `farout._errors` (a plain `ValueError` if that module
/// cannot be imported, which only a broken installation does).
fn raise(class: &'static str, message: String) -> PyErr {
    Python::attach(|py| {
        let class = py.import("farout._errors").and_then(|m| m.getattr(class));
        match class {
            Ok(class) => PyErr::from_type(class.cast_into().expect("exception classes are types"), message),
            Err(_) => PyValueError::new_err(message),
        }
    })
}

/// The I/O error at the root of `e`, if any.
fn io_error<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a std::io::Error> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        next = err.source();
    }
    None
}

/// Whether `e` is a run or a fit stopped on request (a linear solver's error may come bare or
/// inside the training error, which forwards its message and source).
fn is_interrupt(e: &(dyn StdError + 'static)) -> bool {
    use farout_linear::Error as Linear;
    use farout_train::Error as Train;
    matches!(e.downcast_ref::<Train>(), Some(Train::Interrupted { .. } | Train::Linear(Linear::Interrupted { .. })))
        || matches!(e.downcast_ref::<Linear>(), Some(Linear::Interrupted { .. }))
}

/// `Result<T, E>` into `PyResult<T>` through [`to_py`].
pub trait IntoPy<T> {
    /// The Python exception of the error, if any.
    fn py_err(self) -> PyResult<T>;
}

impl<T, E: StdError + 'static> IntoPy<T> for Result<T, E> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| to_py(&e))
    }
}
