//! Upstream streams: `ResponseReader` (an upstream replica's HTTP/1.1 response decoded
//! read by read) and `PromptBody` (a connection's token-id request bodies).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use super::prompt_chain::PyPrompt;
use crate::upstream::body::PromptBody;
use crate::upstream::http::{Progress, ResponseReader};
use crate::upstream::{self, StreamError};

/// A failure as (code, message, whether another replica may be tried).
type Failure = (&'static str, String, bool);

/// One HTTP/1.1 response from an upstream replica, decoded from the bytes of each read
/// (see `upstream::http`): `feed` returns the new token ids and whether anything else
/// changed (the head, the finish, the end of the body, a failure), which the properties
/// then tell; most reads change nothing else.
#[pyclass(name = "ResponseReader", module = "hotloop._core")]
pub(crate) struct PyResponseReader {
    inner: ResponseReader,
    failure: Option<Failure>,
}

impl PyResponseReader {
    fn progress(&mut self, progress: Progress) -> (Vec<u32>, bool) {
        let decoded = progress.decoded;
        let failed = decoded.error.is_some();
        if let Some(error) = decoded.error {
            self.failure = Some(match error {
                StreamError::Upstream(message) => ("upstream_error", message, true),
                StreamError::Aborted(message) => ("upstream_error", message, false),
                StreamError::Protocol(message) => ("upstream_protocol", message, false),
            });
        }
        let news = progress.head || progress.complete || failed || decoded.done || decoded.ended;
        (decoded.ids, news)
    }
}

#[pymethods]
impl PyResponseReader {
    /// `dialect`: the request asked for that dialect's event stream; None: a plain
    /// request whose body is collected. `max_line`: the longest event line (longer
    /// fails the stream with `upstream_protocol`).
    #[new]
    #[pyo3(signature = (dialect=None, max_line=upstream::DEFAULT_MAX_LINE))]
    fn new(dialect: Option<&str>, max_line: usize) -> PyResult<Self> {
        let dialect = dialect
            .map(|name| {
                upstream::Dialect::from_name(name)
                    .ok_or_else(|| PyValueError::new_err(format!("unknown dialect {name:?}")))
            })
            .transpose()?;
        Ok(PyResponseReader {
            inner: ResponseReader::new(dialect).with_max_line(max_line),
            failure: None,
        })
    }

    fn feed(&mut self, data: &[u8]) -> (Vec<u32>, bool) {
        let progress = self.inner.feed(data);
        self.progress(progress)
    }

    fn eof(&mut self) -> (Vec<u32>, bool) {
        let progress = self.inner.eof();
        self.progress(progress)
    }

    #[getter]
    fn status(&self) -> Option<u16> {
        self.inner.status()
    }

    #[getter]
    fn done(&self) -> bool {
        self.inner.events().is_some_and(|events| events.done())
    }

    #[getter]
    fn ended(&self) -> bool {
        self.inner.events().is_some_and(|events| events.ended())
    }

    #[getter]
    fn complete(&self) -> bool {
        self.inner.complete()
    }

    #[getter]
    fn reusable(&self) -> bool {
        self.inner.reusable()
    }

    #[getter]
    fn failure(&self) -> Option<Failure> {
        self.failure.clone()
    }

    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.body())
    }

    /// The bytes held for the stream's incomplete last line.
    #[getter]
    fn buffered(&self) -> usize {
        self.inner.events().map_or(0, |events| events.buffered())
    }

    #[getter]
    fn timings(&self) -> Option<&str> {
        self.inner.events().and_then(|events| events.timings())
    }

    /// The prompt ids the engine said it served from its own KV cache.
    #[getter]
    fn cached_tokens(&self) -> Option<u64> {
        self.inner.events().and_then(|events| events.cached_tokens())
    }
}

/// A connection's token-id request bodies (`upstream::body::PromptBody`).
#[pyclass(name = "PromptBody", module = "hotloop._core")]
pub(crate) struct PyPromptBody {
    inner: PromptBody,
    /// The last body written: `head`, the ids' array (which `inner` brings up to date),
    /// `]`, then the tail.
    out: Option<Py<PyByteArray>>,
    /// The length of the `head` `out` starts with.
    head: usize,
}

#[pymethods]
impl PyPromptBody {
    #[new]
    fn new() -> Self {
        PyPromptBody {
            inner: PromptBody::default(),
            out: None,
            head: 0,
        }
    }

    /// `head`, the prompt's ids as a JSON array, then `tail`: the whole body, in the
    /// bytearray the last call returned, rewritten from its array's first changed byte
    /// on. A body grows by a turn's ids behind a prefix of the whole history: copying
    /// all of it into a new object each turn cost 0.24-0.9 ms at 280k ids. A bytearray
    /// still exported (a transport holding it for an unfinished write) cannot be
    /// resized: it is left to its reader and the body written into a new one.
    fn write<'py>(
        &mut self,
        py: Python<'py>,
        prompt: PyRef<'_, PyPrompt>,
        head: &[u8],
        tail: &[u8],
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let (kept, ids) = self.inner.update(&prompt.inner);
        let written = self.rewrite(py, kept, &ids, head, tail);
        if written.is_err() {
            // The array's bytes are lost with the body: the next write starts afresh.
            self.inner = PromptBody::default();
            self.out = None;
        }
        written
    }
}

impl PyPromptBody {
    /// The last body with its array's first `kept` bytes kept, the rest `ids`.
    fn rewrite<'py>(
        &mut self,
        py: Python<'py>,
        kept: usize,
        ids: &[u8],
        head: &[u8],
        tail: &[u8],
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let old = self.head..self.head + kept;
        let len = head.len() + kept + ids.len() + 1 + tail.len();
        let last = self.out.as_ref().map(|out| out.bind(py).clone());
        let out = match last {
            // Growing it by one byte fails exactly when a buffer of it is exported.
            Some(out) if out.resize(out.len() + 1).is_ok() => {
                out.resize(len.max(old.end))?;
                // SAFETY: nothing exports `out` (it was just resized), and no Python
                // code runs while this slice lives: the GIL is held throughout.
                let bytes = unsafe { out.as_bytes_mut() };
                if old.start != head.len() {
                    bytes.copy_within(old, head.len());
                }
                fill(bytes, head, kept, ids, tail);
                out.resize(len)?;
                out
            }
            held => {
                // SAFETY: read only, and copied out before anything else runs.
                let kept_bytes = match &held {
                    Some(held) => (unsafe { held.as_bytes() })[old].to_vec(),
                    None => Vec::new(),
                };
                PyByteArray::new_with(py, len, |bytes| {
                    bytes[head.len()..head.len() + kept].copy_from_slice(&kept_bytes);
                    fill(bytes, head, kept, ids, tail);
                    Ok(())
                })?
            }
        };
        self.head = head.len();
        self.out = Some(out.clone().unbind());
        Ok(out)
    }
}

/// A body's bytes around the `kept` ones already in place after `head`.
fn fill(bytes: &mut [u8], head: &[u8], kept: usize, ids: &[u8], tail: &[u8]) {
    bytes[..head.len()].copy_from_slice(head);
    let at = head.len() + kept;
    bytes[at..at + ids.len()].copy_from_slice(ids);
    let at = at + ids.len();
    bytes[at] = b']';
    bytes[at + 1..at + 1 + tail.len()].copy_from_slice(tail);
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyResponseReader>()?;
    m.add_class::<PyPromptBody>()
}
