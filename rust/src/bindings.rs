//! The pyo3 bindings: the only module that knows about Python. Each class here wraps a
//! plain Rust type from the core and converts at the boundary, once per call.
//! Sections: errors, tokenizers, chat formats, requests, the cache.

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::Error;

// ---------------------------------------------------------------- errors

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

// ---------------------------------------------------------------- chat formats

use std::sync::Arc;

use crate::format::harmony::Harmony;
use crate::format::ChatFormat;
use crate::item::Item;
use crate::render::Renderer;

/// A chat format: how items become prompt tokens and sampled tokens become items.
#[pyclass(name = "ChatFormat", module = "hotloop._core", frozen)]
pub(crate) struct PyChatFormat {
    pub(crate) inner: Arc<dyn ChatFormat>,
}

#[pymethods]
impl PyChatFormat {
    #[staticmethod]
    fn harmony() -> PyChatFormat {
        PyChatFormat {
            inner: Arc::new(Harmony::new()),
        }
    }

    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    #[getter]
    fn stop_tokens(&self) -> Vec<u32> {
        self.inner.stop_tokens().to_vec()
    }

    /// Reasoning, then text, then calls (`(name, arguments_json)`), as the model samples them.
    #[pyo3(signature = (*, text=None, reasoning=None, calls=Vec::new()))]
    fn completion_tokens(
        &self,
        text: Option<String>,
        reasoning: Option<String>,
        calls: Vec<(String, String)>,
    ) -> Vec<u32> {
        let mut items = Vec::new();
        items.extend(reasoning.map(|text| Item::Reasoning { text }));
        items.extend(text.map(|text| Item::Message {
            role: crate::item::Role::Assistant,
            text,
        }));
        items.extend(calls.into_iter().map(|(name, arguments)| Item::FunctionCall {
            call_id: String::new(),
            name,
            arguments,
        }));
        let mut r = Renderer::new(self.inner.tokenizer().as_ref());
        self.inner.render_completion(&items, &mut r);
        r.finish()
    }

    fn __repr__(&self) -> String {
        format!("ChatFormat({})", self.inner.name())
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CoreError", m.py().get_type::<CoreError>())?;
    m.add_class::<PyChatFormat>()?;
    Ok(())
}
