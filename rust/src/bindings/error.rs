//! `CoreError`: every core `Error` crosses into Python as one exception class carrying
//! its stable `code`, `message` and `param`.

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::Error;

create_exception!(
    _core,
    CoreError,
    PyValueError,
    "A core failure with a stable code."
);

/// Build a `CoreError` carrying `code`, `message` and `param` attributes.
pub(crate) fn core_error(py: Python<'_>, e: &Error) -> PyErr {
    let err = CoreError::new_err(e.to_string());
    let value = err.value(py);
    let attrs = value
        .setattr("code", e.code.as_str())
        .and_then(|()| value.setattr("message", e.message.as_str()))
        .and_then(|()| value.setattr("param", e.param.as_deref()));
    attrs.err().unwrap_or(err)
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        Python::with_gil(|py| core_error(py, &e))
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CoreError", m.py().get_type::<CoreError>())
}
