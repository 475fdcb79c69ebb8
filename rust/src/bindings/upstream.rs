//! Upstream streams: `ResponseReader` (an upstream replica's HTTP/1.1 response decoded
//! read by read) and `RequestBodies` (the token-id request bodies).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView, PySlice};

use super::prompt_chain::PyPrompt;
use crate::upstream::body;
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

/// A process's token-id request bodies (`upstream::body`): each written whole, into
/// one buffer reused while no transport still holds it.
#[pyclass(name = "RequestBodies", module = "hotloop._core")]
pub(crate) struct PyRequestBodies {
    /// The last body's bytearray, as long as the most room a body took (`body::array_room`:
    /// 11 bytes an id of the longest prompt written).
    buffer: Option<Py<PyByteArray>>,
}

#[pymethods]
impl PyRequestBodies {
    #[new]
    fn new() -> Self {
        PyRequestBodies { buffer: None }
    }

    /// `head`, the prompt's ids as a JSON array, then `tail`: a view of the buffer's
    /// first bytes, written over the last body. Reused, the buffer costs no page faults
    /// (a fresh one of `128 KiB` or more is pages of its own, `heap.py`: at 70k ids
    /// faulting them in cost more than writing the ids); one still exported (a
    /// transport holding a view for an unfinished write, a body not yet sent) is left
    /// to its reader and the body written into a new one.
    fn write<'py>(
        &mut self,
        py: Python<'py>,
        prompt: PyRef<'_, PyPrompt>,
        head: &[u8],
        tail: &[u8],
    ) -> PyResult<Bound<'py, PyAny>> {
        let room = head.len() + body::array_room(&prompt.inner) + tail.len();
        let held = self.buffer.as_ref().map(|buffer| buffer.bind(py).clone());
        let buffer = match held {
            // Growing it by one byte fails exactly when a buffer of it is exported.
            Some(buffer) if buffer.resize(buffer.len() + 1).is_ok() => {
                buffer.resize(room.max(buffer.len() - 1))?;
                buffer
            }
            _ => PyByteArray::new_with(py, room, |_| Ok(()))?,
        };
        // SAFETY: nothing exports `buffer` (it was just resized or made), and no Python
        // code runs while this slice lives: the GIL is held throughout.
        let len = body::write_body(&prompt.inner, head, tail, unsafe {
            &mut buffer.as_bytes_mut()[..room]
        });
        self.buffer = Some(buffer.clone().unbind());
        PyMemoryView::from(buffer.as_any())?.get_item(PySlice::new(py, 0, len as isize, 1))
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyResponseReader>()?;
    m.add_class::<PyRequestBodies>()
}
