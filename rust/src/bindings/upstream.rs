//! Upstream streams: `ResponseReader` (an upstream replica's HTTP/1.1 response decoded
//! read by read) and `request_body` (a token-id request body).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

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

/// `head`, the prompt's ids as a JSON array, then `tail`: a request body, written whole
/// from the prompt's chunks (`upstream::body`).
#[pyfunction]
fn request_body<'py>(
    py: Python<'py>,
    prompt: PyRef<'_, PyPrompt>,
    head: &[u8],
    tail: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let len = head.len() + body::array_len(&prompt.inner) + tail.len();
    PyBytes::new_with(py, len, |out| {
        body::write_body(&prompt.inner, head, tail, out);
        Ok(())
    })
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyResponseReader>()?;
    m.add_function(wrap_pyfunction!(request_body, m)?)
}
