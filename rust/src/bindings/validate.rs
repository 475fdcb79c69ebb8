//! Requests: the client events and request bodies parsed and checked on their raw
//! bytes (`parse_event`, `parse_request`, `parse_chat_request`), their limits and the
//! content policy.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use pyo3::exceptions::PyBaseException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use super::error::core_error;
use crate::error::{Code, Error};
use crate::validate::{self, ClientEvent, InputJson};

/// Frames above this size are parsed with the GIL released: other threads (a second
/// event loop, the engine's feeder) keep running while a long history is validated.
const PARSE_WITHOUT_GIL_BYTES: usize = 16 * 1024;

#[pyclass(name = "Limits", module = "hotloop._core", frozen)]
#[derive(Clone)]
pub(crate) struct PyLimits {
    pub(crate) inner: validate::Limits,
}

#[pymethods]
impl PyLimits {
    #[new]
    #[pyo3(signature = (
        *,
        max_items = 10_000,
        max_text_bytes = 10 * 1024 * 1024,
        max_tools = 512,
        max_tools_bytes = 2 * 1024 * 1024,
        images = false,
    ))]
    fn new(
        max_items: usize,
        max_text_bytes: usize,
        max_tools: usize,
        max_tools_bytes: usize,
        images: bool,
    ) -> Self {
        PyLimits {
            inner: validate::Limits {
                max_items,
                max_text_bytes,
                max_tools,
                max_tools_bytes,
                images,
            },
        }
    }

    fn __repr__(&self) -> String {
        let l = &self.inner;
        format!(
            "Limits(max_items={}, max_text_bytes={}, max_tools={}, max_tools_bytes={}, images={})",
            l.max_items,
            l.max_text_bytes,
            l.max_tools,
            l.max_tools_bytes,
            if l.images { "True" } else { "False" }
        )
    }
}

#[pyclass(name = "Policy", module = "hotloop._core", frozen)]
pub(crate) struct PyPolicy {
    pub(crate) inner: Arc<validate::Policy>,
}

#[pymethods]
impl PyPolicy {
    #[new]
    #[pyo3(signature = (patterns, *, case_insensitive = true))]
    fn new(patterns: Vec<String>, case_insensitive: bool) -> PyResult<Self> {
        Ok(PyPolicy {
            inner: Arc::new(validate::Policy::new(&patterns, case_insensitive)?),
        })
    }

    /// Raise `content_policy_violation` if the request's new text hits a pattern.
    fn check(&self, request: &PyCreateRequest) -> PyResult<()> {
        Ok(request.inner.check_policy(&self.inner)?)
    }
}

#[pyclass(name = "CreateRequest", module = "hotloop._core", frozen)]
pub(crate) struct PyCreateRequest {
    pub(crate) inner: validate::CreateRequest,
    /// The frame or body the request was parsed from, when its input's JSON is read from
    /// it (`InputJson::InFrame`).
    frame: Option<Py<PyAny>>,
    /// The body of a request whose leading items were recognized by their bytes, until
    /// its start is settled: parsed again whole when no state is left of them
    /// (`parse_whole`).
    body: Mutex<Option<Kept>>,
}

/// A body kept for parsing again whole: its bytes, limits and API.
struct Kept {
    body: Py<PyAny>,
    limits: validate::Limits,
    chat: bool,
}

impl PyCreateRequest {
    /// `inner`, parsed from `frame`.
    pub(crate) fn new(inner: validate::CreateRequest, frame: &Bound<'_, PyAny>) -> Self {
        let in_frame = matches!(inner.input_json, InputJson::InFrame(_));
        PyCreateRequest {
            inner,
            frame: in_frame.then(|| frame.clone().unbind()),
            body: Mutex::new(None),
        }
    }

    fn body(&self) -> MutexGuard<'_, Option<Kept>> {
        self.body.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keep `body` when the request has items recognized by their bytes.
    fn kept(self, body: &Bound<'_, PyAny>, limits: validate::Limits, chat: bool) -> Self {
        if self.inner.history.seen.items > 0 {
            *self.body() = Some(Kept {
                body: body.clone().unbind(),
                limits,
                chat,
            });
        }
        self
    }
}

/// One API key's raw addresses (`validate::SeenItems`): what `parse_request` recognizes
/// a resent history by. The server forgets a state's addresses when its cache drops the
/// state.
#[pyclass(name = "SeenItems", module = "hotloop._core", frozen)]
pub(crate) struct PySeenItems {
    inner: Mutex<validate::SeenItems>,
}

impl PySeenItems {
    fn lock(&self) -> MutexGuard<'_, validate::SeenItems> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[pymethods]
impl PySeenItems {
    #[new]
    fn new() -> Self {
        PySeenItems {
            inner: Mutex::new(validate::SeenItems::default()),
        }
    }

    /// Remember `request`'s raw address, naming the state of its whole input (kept by
    /// the caller). Returns whether it had one (an `input` array parsed with this map).
    fn remember(&self, request: &PyCreateRequest) -> bool {
        self.lock().remember(&request.inner)
    }

    /// Forget the raw addresses of the state at history digest `digest`.
    fn forget(&self, digest: &[u8]) -> PyResult<()> {
        self.lock().forget(digest_of(digest)?);
        Ok(())
    }

    fn clear(&self) {
        self.lock().clear();
    }

    fn __len__(&self) -> usize {
        self.lock().len()
    }
}

#[pymethods]
impl PyCreateRequest {
    #[getter(r#type)]
    fn kind(&self) -> &'static str {
        "response.create"
    }
    #[getter]
    fn error(&self, py: Python<'_>) -> Option<Py<PyBaseException>> {
        self.inner
            .error
            .as_ref()
            .map(|e| core_error(py, e).into_value(py))
    }
    #[getter]
    fn model(&self) -> Option<&str> {
        self.inner.model.as_deref()
    }
    #[getter]
    fn previous_response_id(&self) -> Option<&str> {
        self.inner.previous_response_id.as_deref()
    }
    #[getter]
    fn conversation(&self) -> Option<&str> {
        self.inner.conversation.as_deref()
    }
    #[getter]
    fn stream_id(&self) -> Option<&str> {
        self.inner.stream_id.as_deref()
    }
    #[getter]
    fn store(&self) -> bool {
        self.inner.store
    }
    #[getter]
    fn generate(&self) -> bool {
        self.inner.generate
    }
    #[getter]
    fn background(&self) -> bool {
        self.inner.background
    }
    #[getter]
    fn stream(&self) -> bool {
        self.inner.stream
    }
    #[getter]
    fn instructions(&self) -> Option<&str> {
        self.inner.prefix.instructions.as_deref()
    }
    #[getter]
    fn max_output_tokens(&self) -> Option<u64> {
        self.inner.max_output_tokens
    }
    #[getter]
    fn temperature(&self) -> Option<f64> {
        self.inner.temperature
    }
    #[getter]
    fn top_p(&self) -> Option<f64> {
        self.inner.top_p
    }
    #[getter]
    fn compact_threshold(&self) -> Option<u64> {
        self.inner.compact_threshold
    }
    #[getter]
    fn prompt_cache_key(&self) -> Option<&str> {
        self.inner.prompt_cache.key.as_deref()
    }
    #[getter]
    fn comparison_response_id(&self) -> Option<&str> {
        let options = self.inner.prompt_cache.options.as_ref()?;
        options.comparison_response_id.as_deref()
    }
    #[getter]
    fn compaction_trigger(&self) -> bool {
        self.inner.input.compaction_trigger
    }
    #[getter]
    fn reasoning_effort(&self) -> Option<&str> {
        self.inner.prefix.reasoning_effort.as_deref()
    }
    #[getter]
    fn input_item_count(&self) -> usize {
        self.inner.input.offset + self.inner.input.items.len()
    }
    /// The leading input items recognized by their bytes and not parsed
    /// (`parse_request`'s `seen`): `history_digests` starts after them.
    #[getter]
    fn seen_items(&self) -> usize {
        self.inner.history.seen.items
    }
    #[getter]
    fn input_bytes(&self) -> usize {
        self.inner.input_bytes
    }
    #[getter]
    fn frame_bytes(&self) -> usize {
        self.inner.frame_bytes
    }
    #[getter]
    fn input_json<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        let json = match &self.frame {
            Some(frame) => {
                let frame = frame.bind(py);
                let text = std::str::from_utf8(frame_bytes(frame)?).map_err(|_| not_utf8())?;
                PyString::new(py, self.inner.input_json.text(text))
            }
            None => PyString::new(py, self.inner.input_json.text("")),
        };
        Ok(json)
    }
    #[getter]
    fn response_fields_json(&self) -> &str {
        &self.inner.response_fields_json
    }
    /// The content address of what the format renders before the items.
    #[getter]
    fn prefix_digest<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        digest_bytes(py, self.inner.history.prefix)
    }

    /// The chained content addresses after each parsed input item, starting from
    /// `start` (a parent state's; when None, the address after the `seen_items`, the
    /// prefix's when there are none): `start` first.
    #[pyo3(signature = (start = None))]
    fn history_digests<'py>(
        &self,
        py: Python<'py>,
        start: Option<&[u8]>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let start = start.map(digest_of).transpose()?;
        let chained = self.inner.history.chained(start);
        Ok(chained.into_iter().map(|d| digest_bytes(py, d)).collect())
    }

    /// The request parsed again whole, its items recognized by their bytes too (no state
    /// of them is left to continue); None when it has no such items or was settled.
    fn parse_whole(&self, py: Python<'_>) -> PyResult<Option<PyCreateRequest>> {
        let Some(Kept { body, limits, chat }) = self.body().take() else {
            return Ok(None);
        };
        let body = body.bind(py);
        let inner = parse_frame(py, body, |b| {
            if chat {
                validate::parse_chat_request(b, &limits).map(|chat| chat.request)
            } else {
                validate::parse_request(b, &limits)
            }
        })?;
        Ok(Some(PyCreateRequest::new(inner, body)))
    }

    /// Where the request starts is settled: its body is no longer kept.
    fn settle(&self) {
        self.body().take();
    }

    /// Bytes of text in the input items from `first` on.
    #[pyo3(signature = (first = 0))]
    fn text_bytes(&self, first: usize) -> usize {
        self.inner.input.text_bytes(first)
    }

    #[getter]
    fn skipped_tools(&self) -> Vec<(String, Option<String>)> {
        self.inner
            .skipped_tools
            .iter()
            .map(|t| (t.kind.clone(), t.name.clone()))
            .collect()
    }

    fn __repr__(&self) -> String {
        let r = &self.inner;
        let quoted = |v: &Option<String>| v.as_ref().map_or("None".to_string(), |s| format!("{s:?}"));
        format!(
            "CreateRequest(model={}, previous_response_id={}, stream_id={}, items={}, error={})",
            quoted(&r.model),
            quoted(&r.previous_response_id),
            quoted(&r.stream_id),
            r.input.items.len(),
            quoted(&r.error.as_ref().map(|e| e.code.as_str().to_string()))
        )
    }
}

#[pyclass(name = "CancelEvent", module = "hotloop._core", frozen, get_all)]
pub(crate) struct PyCancelEvent {
    response_id: Option<String>,
    stream_id: Option<String>,
}

#[pymethods]
impl PyCancelEvent {
    #[getter(r#type)]
    fn kind(&self) -> &'static str {
        "response.cancel"
    }
}

#[pyclass(name = "ProcessedEvent", module = "hotloop._core", frozen, get_all)]
pub(crate) struct PyProcessedEvent {
    response_id: Option<String>,
}

#[pymethods]
impl PyProcessedEvent {
    #[getter(r#type)]
    fn kind(&self) -> &'static str {
        "response.processed"
    }
}

#[pyclass(name = "AppendEvent", module = "hotloop._core", frozen)]
pub(crate) struct PyAppendEvent {
    pub(crate) inner: validate::AppendEvent,
}

#[pymethods]
impl PyAppendEvent {
    #[getter(r#type)]
    fn kind(&self) -> &'static str {
        "response.append"
    }
    #[getter]
    fn response_id(&self) -> Option<&str> {
        self.inner.response_id.as_deref()
    }
    #[getter]
    fn error(&self, py: Python<'_>) -> Option<Py<PyBaseException>> {
        self.inner
            .error
            .as_ref()
            .map(|e| core_error(py, e).into_value(py))
    }
    #[getter]
    fn input_json(&self) -> &str {
        &self.inner.input_json
    }
}

#[pyclass(name = "UnknownEvent", module = "hotloop._core", frozen)]
pub(crate) struct PyUnknownEvent {
    kind: String,
    #[pyo3(get)]
    stream_id: Option<String>,
}

#[pymethods]
impl PyUnknownEvent {
    #[getter(r#type)]
    fn kind(&self) -> &str {
        &self.kind
    }
}

/// A request body written as its pieces arrive, into a buffer the process reuses
/// (`validate::Body`: a resent history no longer maps fresh pages each turn), then
/// sealed and parsed like `bytes`. Sealed, it never changes: a parse reads it with the
/// GIL released.
#[pyclass(name = "Body", module = "hotloop._core", frozen)]
pub(crate) struct PyBody {
    open: Mutex<Option<validate::Body>>,
    sealed: OnceLock<validate::Body>,
}

impl PyBody {
    fn open(&self) -> MutexGuard<'_, Option<validate::Body>> {
        self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The body's bytes once sealed.
    fn bytes(&self) -> PyResult<&[u8]> {
        match self.sealed.get() {
            Some(body) => Ok(body.as_slice()),
            None => Err(Error::new(Code::InvalidValue, "a body is read only once sealed").into()),
        }
    }
}

#[pymethods]
impl PyBody {
    /// Bodies declared at least this long are worth a `Body`: below it the C
    /// allocator's heap recycles their memory anyway.
    #[classattr]
    const POOLED_BYTES: usize = validate::POOLED_BODY_BYTES;

    /// A body declared `size` bytes long (its `Content-Length`).
    #[new]
    fn new(size: usize) -> Self {
        PyBody {
            open: Mutex::new(Some(validate::Body::with_capacity(size))),
            sealed: OnceLock::new(),
        }
    }

    /// Append a piece as it arrives.
    fn write(&self, piece: &[u8]) -> PyResult<()> {
        match self.open().as_mut() {
            Some(body) => Ok(body.extend(piece)?),
            None => Err(Error::new(Code::InvalidValue, "a sealed body takes no more bytes").into()),
        }
    }

    /// No more pieces: the body can be read.
    fn seal(&self) {
        if let Some(body) = self.open().take() {
            let _ = self.sealed.set(body);
        }
    }

    fn __len__(&self) -> usize {
        match (self.sealed.get(), self.open().as_ref()) {
            (Some(body), _) | (None, Some(body)) => body.len(),
            (None, None) => 0,
        }
    }

    /// A copy, for the rare reader that needs `bytes` (an MCP rewrite, a refused body
    /// searched for compaction items).
    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, self.bytes()?))
    }

    fn __contains__(&self, needle: &[u8]) -> PyResult<bool> {
        Ok(memchr::memmem::find(self.bytes()?, needle).is_some())
    }

    /// Idle pooled buffers and their bytes, process-wide.
    #[staticmethod]
    fn pooled() -> (usize, usize) {
        validate::pooled_bodies()
    }

    /// Free every idle pooled buffer (a heap trim's first step).
    #[staticmethod]
    fn release_pool() {
        validate::release_pooled_bodies()
    }
}

/// The bytes of a frame: `bytes` as is, a sealed `Body`'s, `str` as its UTF-8 (a str
/// that cannot be encoded, with lone surrogates, is malformed input, not a crash).
fn frame_bytes<'a>(frame: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    if let Ok(bytes) = frame.downcast::<PyBytes>() {
        return Ok(bytes.as_bytes());
    }
    if let Ok(body) = frame.downcast::<PyBody>() {
        return body.get().bytes();
    }
    let text = frame.downcast::<PyString>()?;
    text.to_str().map(str::as_bytes).map_err(|_| not_utf8().into())
}

fn not_utf8() -> Error {
    Error::new(Code::InvalidJson, "The message is not valid UTF-8 text.")
}

fn parse_frame<T: Send>(
    py: Python<'_>,
    frame: &Bound<'_, PyAny>,
    parse: impl FnOnce(&[u8]) -> crate::Result<T> + Send,
) -> PyResult<T> {
    let bytes = frame_bytes(frame)?;
    let parsed = if bytes.len() >= PARSE_WITHOUT_GIL_BYTES {
        py.allow_threads(|| parse(bytes))
    } else {
        parse(bytes)
    };
    Ok(parsed?)
}

#[pyfunction]
#[pyo3(signature = (frame, limits = None))]
fn parse_event(py: Python<'_>, frame: &Bound<'_, PyAny>, limits: Option<&PyLimits>) -> PyResult<PyObject> {
    let limits = limits.map(|l| l.inner).unwrap_or_default();
    let event = parse_frame(py, frame, |b| validate::parse_event(b, &limits))?;
    Ok(match event {
        ClientEvent::Create(request) => Py::new(py, PyCreateRequest::new(*request, frame))?.into_any(),
        ClientEvent::Cancel {
            response_id,
            stream_id,
        } => Py::new(
            py,
            PyCancelEvent {
                response_id,
                stream_id,
            },
        )?
        .into_any(),
        ClientEvent::Processed { response_id } => Py::new(py, PyProcessedEvent { response_id })?.into_any(),
        ClientEvent::Append(inner) => Py::new(py, PyAppendEvent { inner })?.into_any(),
        ClientEvent::Unknown { kind, stream_id } => {
            Py::new(py, PyUnknownEvent { kind, stream_id })?.into_any()
        }
    })
}

/// `seen`: the key's raw addresses, for a request that may resend its whole history.
#[pyfunction]
#[pyo3(signature = (body, limits = None, seen = None))]
fn parse_request(
    py: Python<'_>,
    body: &Bound<'_, PyAny>,
    limits: Option<&PyLimits>,
    seen: Option<&PySeenItems>,
) -> PyResult<PyCreateRequest> {
    let limits = limits.map(|l| l.inner).unwrap_or_default();
    let inner = parse_frame(py, body, |b| {
        validate::parse_request_seen(b, &limits, seen.map(|s| s.lock()).as_deref())
    })?;
    Ok(PyCreateRequest::new(inner, body).kept(body, limits, false))
}

fn digest_bytes(py: Python<'_>, digest: validate::Digest) -> Bound<'_, PyBytes> {
    PyBytes::new(py, &digest.to_le_bytes())
}

fn digest_of(bytes: &[u8]) -> PyResult<validate::Digest> {
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| Error::new(Code::InvalidValue, "a history digest is 16 bytes"))?;
    Ok(u128::from_le_bytes(bytes))
}

/// The content address of a state after a response's output (`output_json`, the
/// `output` array the server sent) is appended to the state at `start`.
#[pyfunction]
fn history_after_output<'py>(
    py: Python<'py>,
    start: &[u8],
    output_json: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut at = digest_of(start)?;
    for item in validate::output_digests(output_json)? {
        at = validate::history::chain(at, item);
    }
    Ok(digest_bytes(py, at))
}

/// A Chat Completions request: the [`PyCreateRequest`] it is served as, and what its
/// reply needs beside it.
#[pyclass(name = "ChatRequest", module = "hotloop._core", frozen, get_all)]
pub(crate) struct PyChatRequest {
    request: Py<PyCreateRequest>,
    include_usage: bool,
}

/// `seen`: the key's raw addresses, as for `parse_request`.
#[pyfunction]
#[pyo3(signature = (body, limits = None, seen = None))]
fn parse_chat_request(
    py: Python<'_>,
    body: &Bound<'_, PyAny>,
    limits: Option<&PyLimits>,
    seen: Option<&PySeenItems>,
) -> PyResult<PyChatRequest> {
    let limits = limits.map(|l| l.inner).unwrap_or_default();
    let chat = parse_frame(py, body, |b| {
        validate::parse_chat_request_seen(b, &limits, seen.map(|s| s.lock()).as_deref())
    })?;
    Ok(PyChatRequest {
        request: Py::new(
            py,
            PyCreateRequest::new(chat.request, body).kept(body, limits, true),
        )?,
        include_usage: chat.options.include_usage,
    })
}

/// The boundary invariant alone (`validate::check_values`): for Python code that must
/// load a frame with a strict parser before the core parses it (compaction's expansion).
#[pyfunction]
fn check_values(py: Python<'_>, frame: &Bound<'_, PyAny>) -> PyResult<()> {
    parse_frame(py, frame, |b| {
        validate::check_values(std::str::from_utf8(b).map_err(|_| not_utf8())?)
    })
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBody>()?;
    m.add_class::<PyLimits>()?;
    m.add_class::<PyPolicy>()?;
    m.add_class::<PyCreateRequest>()?;
    m.add_class::<PySeenItems>()?;
    m.add_class::<PyChatRequest>()?;
    m.add_class::<PyCancelEvent>()?;
    m.add_class::<PyProcessedEvent>()?;
    m.add_class::<PyAppendEvent>()?;
    m.add_class::<PyUnknownEvent>()?;
    m.add_function(wrap_pyfunction!(parse_event, m)?)?;
    m.add_function(wrap_pyfunction!(parse_request, m)?)?;
    m.add_function(wrap_pyfunction!(parse_chat_request, m)?)?;
    m.add_function(wrap_pyfunction!(history_after_output, m)?)?;
    m.add_function(wrap_pyfunction!(check_values, m)?)
}
