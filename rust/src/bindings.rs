//! The pyo3 bindings: the only module that knows about Python. Each class here wraps a
//! plain Rust type from the core and converts at the boundary, once per call.

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
