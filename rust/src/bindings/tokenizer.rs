//! The tokenizers: `Tokenizer` (any vocabulary the core loads), `StreamDecoder`
//! (sampled ids to text as they stream) and `IncrementalText` (a growing text kept
//! tokenized).

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PyString};

use super::RELEASE_GIL_BYTES;
use crate::error::{Code, Error};
use crate::tokenizer::{self, detok, incremental, Tokenizer};

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

    /// A tokenizer from a file's contents passed as `str` or `bytes`.
    fn from_file_contents(
        data: &Bound<'_, PyAny>,
        load: fn(&[u8]) -> crate::error::Result<Arc<dyn Tokenizer>>,
    ) -> PyResult<Self> {
        let inner = match data.downcast::<PyString>() {
            Ok(text) => load(text.to_str()?.as_bytes())?,
            Err(_) => load(data.downcast::<PyBytes>()?.as_bytes())?,
        };
        Ok(PyTokenizer { inner })
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
        Self::from_file_contents(data, tokenizer::from_tokenizer_json)
    }

    #[staticmethod]
    fn from_tekken(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::from_file_contents(data, tokenizer::from_tekken)
    }

    #[staticmethod]
    fn from_sentencepiece_model(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::from_file_contents(data, tokenizer::from_sentencepiece_model)
    }

    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn encode<'py>(&self, py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyList>> {
        let mut ids = Vec::new();
        if text.len() >= RELEASE_GIL_BYTES {
            // A text of `PARALLEL_BYTES` or more is encoded on every CPU.
            let parts = tokenizer::threads();
            py.allow_threads(|| tokenizer::encode_parallel(&*self.inner, text, parts, &mut ids));
        } else {
            self.inner.encode(text, &mut ids);
        }
        id_list(py, &ids, self.inner.vocab_size())
    }

    fn decode(&self, ids: Vec<u32>) -> PyResult<String> {
        let mut bytes = Vec::new();
        self.inner.decode_text(&self.checked_ids(ids)?, &mut bytes);
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
        ids_from(self.inner.ids(), start)
    }

    fn __len__(&self) -> usize {
        self.inner.ids().len()
    }

    #[getter]
    fn fallbacks(&self) -> u64 {
        self.inner.stats().fallbacks
    }
}

/// Lists of at least this many ids share one `int` object per distinct id.
const SHARED_INTS_FROM: usize = 4096;

/// `ids` as a Python list of `int`. A long one holds one `int` object per distinct id,
/// each as often as it occurs (ints are immutable: no caller can tell), instead of a
/// fresh object per id: a text's ids repeat (a 1 MB source file's 250k ids are ~10k
/// distinct ones), and 32 bytes of fresh memory per id was most of the cost of the list
/// and, at 10 MB, page faults that grew faster than the text.
fn id_list<'py>(py: Python<'py>, ids: &[u32], vocab_size: usize) -> PyResult<Bound<'py, PyList>> {
    if ids.len() < SHARED_INTS_FROM {
        return PyList::new(py, ids);
    }
    let mut ints: Vec<Option<Bound<'py, PyInt>>> = vec![None; vocab_size];
    let items = ids.iter().map(|&id| match ints.get_mut(id as usize) {
        Some(slot) => slot.get_or_insert_with(|| PyInt::new(py, id)).clone(),
        None => PyInt::new(py, id),
    });
    PyList::new(py, items)
}

/// The ids from `start` on (none past the end).
fn ids_from(ids: &[u32], start: usize) -> Vec<u32> {
    ids.get(start..).unwrap_or_default().to_vec()
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTokenizer>()?;
    m.add_class::<PyStreamDecoder>()?;
    m.add_class::<PyIncrementalText>()
}
