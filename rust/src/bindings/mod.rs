//! The pyo3 bindings: the only module that knows about Python. Each class here wraps a
//! plain Rust type from the core and converts at the boundary, once per call.
//!
//! One file per core module, named as it is: `error`, `tokenizer`, `format` (with
//! `format::template`), `validate`, `prompt_chain`, `upstream`. Each registers its own
//! classes and functions in `_core`; this file holds what they share.

mod error;
mod format;
mod prompt_chain;
mod tokenizer;
mod upstream;
mod validate;

use pyo3::prelude::*;

use crate::error::{Code, Error};

/// Texts at least this long are encoded with the GIL released (below it, releasing
/// costs more than it lets other threads gain). Renders use it too, by input bytes: a
/// render's cost is its tokenization.
const RELEASE_GIL_BYTES: usize = 4096;

/// A JSON argument parsed, or `invalid_json` naming `what` it was.
fn json_arg<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> PyResult<T> {
    serde_json::from_str(text)
        .map_err(|e| Error::new(Code::InvalidJson, format!("{what} is not valid JSON: {e}")).into())
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    error::register(m)?;
    tokenizer::register(m)?;
    format::register(m)?;
    validate::register(m)?;
    prompt_chain::register(m)?;
    upstream::register(m)?;
    Ok(())
}
