//! The pyo3 bindings: the only module that knows about Python. Each class here wraps a
//! plain Rust type from the core and converts at the boundary, once per call.
//! Sections: errors, tokenizers, chat formats, requests, the cache.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::error::{Code, Error};
use crate::tokenizer::{self, detok, incremental, Tokenizer};

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

// ---------------------------------------------------------------- tokenizers

/// Texts at least this long are encoded with the GIL released (below it, releasing
/// costs more than it lets other threads gain).
const RELEASE_GIL_BYTES: usize = 4096;

#[pyclass(name = "Tokenizer", module = "hotloop._core", frozen)]
pub(crate) struct PyTokenizer {
    pub(crate) inner: Arc<dyn Tokenizer>,
}

impl PyTokenizer {
    /// Check that every id is below the vocabulary size (ids in a vocabulary's unused
    /// gaps decode to nothing, as they have no bytes).
    fn checked_ids(&self, ids: Vec<u32>) -> PyResult<Vec<u32>> {
        let size = self.inner.vocab_size();
        match ids.iter().position(|&id| id as usize >= size) {
            Some(i) => Err(Error::new(
                Code::InvalidValue,
                format!("token id {} is not below the vocabulary size {size}", ids[i]),
            )
            .at(format!("ids[{i}]"))
            .into()),
            None => Ok(ids),
        }
    }

    fn bytes_of(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        self.inner.decode_bytes(ids, &mut out);
        out
    }
}

#[pymethods]
impl PyTokenizer {
    #[staticmethod]
    fn openai(name: &str) -> PyResult<Self> {
        let inner = tokenizer::by_name(name).ok_or_else(|| {
            Error::new(
                Code::UnknownTokenizer,
                format!("unknown encoding {name:?}: expected o200k_base, o200k_harmony or cl100k_base"),
            )
        })?;
        Ok(PyTokenizer { inner })
    }

    #[staticmethod]
    fn from_gguf(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let inner = py.allow_threads(|| tokenizer::from_gguf(&path))?;
        Ok(PyTokenizer { inner })
    }

    #[staticmethod]
    fn from_tokenizer_json(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let inner = if let Ok(text) = data.downcast::<PyString>() {
            tokenizer::from_tokenizer_json(text.to_str()?.as_bytes())?
        } else {
            tokenizer::from_tokenizer_json(data.downcast::<PyBytes>()?.as_bytes())?
        };
        Ok(PyTokenizer { inner })
    }

    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn encode(&self, py: Python<'_>, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        if text.len() >= RELEASE_GIL_BYTES {
            py.allow_threads(|| self.inner.encode(text, &mut ids));
        } else {
            self.inner.encode(text, &mut ids);
        }
        ids
    }

    fn decode(&self, ids: Vec<u32>) -> PyResult<String> {
        let bytes = self.bytes_of(&self.checked_ids(ids)?);
        Ok(match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    fn decode_bytes<'py>(&self, py: Python<'py>, ids: Vec<u32>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.bytes_of(&self.checked_ids(ids)?);
        Ok(PyBytes::new(py, &bytes))
    }

    fn special(&self, name: &str) -> Option<u32> {
        self.inner.special(name)
    }

    fn __repr__(&self) -> String {
        format!(
            "Tokenizer({:?}, vocab_size={})",
            self.inner.name(),
            self.inner.vocab_size()
        )
    }
}

#[pyclass(name = "StreamDecoder", module = "hotloop._core")]
pub(crate) struct PyStreamDecoder {
    tokenizer: Py<PyTokenizer>,
    decoder: detok::StreamDecoder,
}

#[pymethods]
impl PyStreamDecoder {
    #[new]
    fn new(tokenizer: Py<PyTokenizer>) -> Self {
        PyStreamDecoder {
            tokenizer,
            decoder: detok::StreamDecoder::new(),
        }
    }

    fn feed(&mut self, ids: Vec<u32>) -> PyResult<String> {
        let tokenizer = self.tokenizer.get();
        let ids = tokenizer.checked_ids(ids)?;
        let mut out = String::new();
        self.decoder.feed(tokenizer.inner.as_ref(), &ids, &mut out);
        Ok(out)
    }

    fn finish(&mut self) -> String {
        let mut out = String::new();
        self.decoder.finish(&mut out);
        out
    }
}

#[pyclass(name = "IncrementalText", module = "hotloop._core")]
pub(crate) struct PyIncrementalText {
    tokenizer: Py<PyTokenizer>,
    inner: incremental::IncrementalText,
}

#[pymethods]
impl PyIncrementalText {
    #[new]
    #[pyo3(signature = (tokenizer, text = ""))]
    fn new(tokenizer: Py<PyTokenizer>, text: &str) -> Self {
        let inner = incremental::IncrementalText::with_text(tokenizer.get().inner.as_ref(), text);
        PyIncrementalText { tokenizer, inner }
    }

    fn push(&mut self, chunk: &str) -> usize {
        self.inner.push_str(self.tokenizer.get().inner.as_ref(), chunk)
    }

    #[getter]
    fn text(&self) -> &str {
        self.inner.text()
    }

    fn ids(&self) -> Vec<u32> {
        self.inner.ids().to_vec()
    }

    fn ids_from(&self, start: usize) -> Vec<u32> {
        self.inner.ids().get(start..).unwrap_or_default().to_vec()
    }

    fn __len__(&self) -> usize {
        self.inner.ids().len()
    }

    #[getter]
    fn fallbacks(&self) -> u64 {
        self.inner.stats().fallbacks
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CoreError", m.py().get_type::<CoreError>())?;
    m.add_class::<PyTokenizer>()?;
    m.add_class::<PyStreamDecoder>()?;
    m.add_class::<PyIncrementalText>()?;
    Ok(())
}
