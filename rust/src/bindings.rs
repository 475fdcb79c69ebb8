//! The pyo3 bindings: the only module that knows about Python. Each class here wraps a
//! plain Rust type from the core and converts at the boundary, once per call.
//! Sections: errors, tokenizers, chat formats, requests, the cache, upstream streams.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::create_exception;
use pyo3::exceptions::{PyBaseException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyString};

use crate::error::{Code, Error};
use crate::tokenizer::{self, detok, incremental, Tokenizer};
use crate::upstream::body::PromptBody;
use crate::upstream::http::{Progress, ResponseReader};
use crate::upstream::{self, StreamError};
use crate::validate::{self, ClientEvent};

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
/// costs more than it lets other threads gain). Renders use it too, by input bytes: a
/// render's cost is its tokenization.
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

// ---------------------------------------------------------------- chat formats

use crate::format::chatml::ChatMl;
use crate::format::harmony::Harmony;
use crate::format::ChatFormat;
use crate::item::{Item, Role};
use crate::render::Renderer;

/// The two kinds of chat format: rendered item by item (harmony, ChatML), or through
/// a model's own chat template.
#[derive(Clone)]
enum FormatKind {
    Items(Arc<dyn ChatFormat>),
    Template(Arc<TemplateFormat>),
}

/// A chat format: how items become prompt tokens and sampled tokens become items.
#[pyclass(name = "ChatFormat", module = "hotloop._core", frozen)]
pub(crate) struct PyChatFormat {
    inner: FormatKind,
}

#[pymethods]
impl PyChatFormat {
    #[staticmethod]
    fn harmony() -> PyChatFormat {
        PyChatFormat {
            inner: FormatKind::Items(Arc::new(Harmony::new())),
        }
    }

    #[staticmethod]
    #[pyo3(signature = (tokenizer, default_system=None))]
    fn chatml(tokenizer: &PyTokenizer, default_system: Option<String>) -> PyResult<PyChatFormat> {
        let format = ChatMl::new(tokenizer.inner.clone(), default_system)?;
        Ok(PyChatFormat {
            inner: FormatKind::Items(Arc::new(format)),
        })
    }

    /// The generic format: a model's own chat template over its vocabulary.
    #[staticmethod]
    #[pyo3(signature = (template, tokenizer, *, kwargs_json = None, tool_parser = None,
                        verbatim = false, window = true, check_every = 64,
                        special_tokens_in_content = "plain"))]
    #[allow(clippy::too_many_arguments)]
    fn template(
        template: &PyChatTemplate,
        tokenizer: &PyTokenizer,
        kwargs_json: Option<&str>,
        tool_parser: Option<&str>,
        verbatim: bool,
        window: bool,
        check_every: u64,
        special_tokens_in_content: &str,
    ) -> PyResult<PyChatFormat> {
        let kwargs = kwargs_json
            .map(|k| json_arg("template kwargs", k))
            .transpose()?
            .unwrap_or_default();
        let policy = TemplatePolicy {
            window,
            check_every,
            verbatim,
        };
        let format = TemplateFormat::new(
            template.inner.clone(),
            tokenizer.inner.clone(),
            kwargs,
            tool_parser,
            policy,
            ContentSpecials::by_name(special_tokens_in_content)?,
        )?;
        Ok(PyChatFormat {
            inner: FormatKind::Template(Arc::new(format)),
        })
    }

    /// `harmony`, `chatml`, or `template:<template name>`.
    #[getter]
    fn name(&self) -> String {
        match &self.inner {
            FormatKind::Items(f) => f.name().to_owned(),
            FormatKind::Template(f) => format!("template:{}", f.name()),
        }
    }

    #[getter]
    fn tokenizer(&self) -> PyTokenizer {
        PyTokenizer {
            inner: match &self.inner {
                FormatKind::Items(f) => f.tokenizer().clone(),
                FormatKind::Template(f) => f.tokenizer().clone(),
            },
        }
    }

    #[getter]
    fn stop_tokens(&self) -> Vec<u32> {
        match &self.inner {
            FormatKind::Items(f) => f.stop_tokens().to_vec(),
            FormatKind::Template(f) => f.stop_tokens().to_vec(),
        }
    }

    /// The tool-call parser of a template format (`hermes`, ...); None for the others.
    #[getter]
    fn tool_parser(&self) -> Option<&'static str> {
        match &self.inner {
            FormatKind::Items(_) => None,
            FormatKind::Template(f) => Some(f.family().name()),
        }
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
            role: Role::Assistant,
            text,
        }));
        items.extend(calls.into_iter().map(|(name, arguments)| Item::FunctionCall {
            call_id: String::new(),
            name,
            arguments,
        }));
        match &self.inner {
            FormatKind::Items(f) => {
                let mut r = Renderer::new(f.tokenizer().as_ref());
                f.render_completion(&items, &mut r);
                r.finish()
            }
            FormatKind::Template(f) => f.completion_tokens(&items),
        }
    }

    fn __repr__(&self) -> String {
        format!("ChatFormat({})", self.name())
    }
}

// ---------------------------------------------------------------- requests

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
        self.inner.input.items.len()
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
    fn input_json(&self) -> &str {
        &self.inner.input_json
    }
    #[getter]
    fn response_fields_json(&self) -> &str {
        &self.inner.response_fields_json
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

/// The bytes of a frame: `bytes` as is, `str` as its UTF-8 (a str that cannot be
/// encoded, with lone surrogates, is malformed input, not a crash).
fn frame_bytes<'a>(frame: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    if let Ok(bytes) = frame.downcast::<PyBytes>() {
        return Ok(bytes.as_bytes());
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
        ClientEvent::Create(request) => Py::new(py, PyCreateRequest { inner: *request })?.into_any(),
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

#[pyfunction]
#[pyo3(signature = (body, limits = None))]
fn parse_request(
    py: Python<'_>,
    body: &Bound<'_, PyAny>,
    limits: Option<&PyLimits>,
) -> PyResult<PyCreateRequest> {
    let limits = limits.map(|l| l.inner).unwrap_or_default();
    let inner = parse_frame(py, body, |b| validate::parse_request(b, &limits))?;
    Ok(PyCreateRequest { inner })
}

/// The boundary invariant alone (`validate::check_values`): for Python code that must
/// load a frame with a strict parser before the core parses it (compaction's expansion).
#[pyfunction]
fn check_values(py: Python<'_>, frame: &Bound<'_, PyAny>) -> PyResult<()> {
    parse_frame(py, frame, |b| {
        validate::check_values(std::str::from_utf8(b).map_err(|_| not_utf8())?)
    })
}

// ---------------------------------------------------------------- the cache

use crate::conversation::{Checkpoint, Conversation, Prompt, Turn, TurnParser};
use crate::format::{Outcome, ParseEvent};
use crate::validate::Policy;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::sync::{Mutex, MutexGuard};

#[pyclass(name = "Turn", module = "hotloop._core", frozen, get_all)]
struct PyTurn {
    prompt_tokens: usize,
    cached_tokens: usize,
    new_tokens: usize,
    invalidated: bool,
}

impl From<Turn> for PyTurn {
    fn from(t: Turn) -> Self {
        PyTurn {
            prompt_tokens: t.prompt_tokens,
            cached_tokens: t.cached_tokens,
            new_tokens: t.new_tokens,
            invalidated: t.invalidated,
        }
    }
}

#[pymethods]
impl PyTurn {
    fn __repr__(&self) -> String {
        format!(
            "Turn(prompt_tokens={}, cached_tokens={}, new_tokens={}, invalidated={})",
            self.prompt_tokens,
            self.cached_tokens,
            self.new_tokens,
            if self.invalidated { "True" } else { "False" }
        )
    }
}

#[pyclass(name = "Prompt", module = "hotloop._core", frozen)]
struct PyPrompt {
    inner: Prompt,
}

#[pymethods]
impl PyPrompt {
    #[staticmethod]
    fn from_tokens(ids: Vec<u32>) -> PyPrompt {
        PyPrompt {
            inner: Prompt::from_tokens(&ids),
        }
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn tokens(&self) -> Vec<u32> {
        self.inner.tokens()
    }

    fn tokens_from(&self, start: usize) -> Vec<u32> {
        self.inner.tokens_from(start)
    }

    fn common_prefix_len(&self, other: PyRef<'_, PyPrompt>) -> usize {
        self.inner.common_prefix_len(&other.inner)
    }
}

/// `ParseEvent` as the tuples `_core.pyi` documents.
fn event_tuple<'py>(py: Python<'py>, event: ParseEvent) -> PyResult<Bound<'py, PyTuple>> {
    match event {
        ParseEvent::MessageStart { index } => ("message_start", index).into_pyobject(py),
        ParseEvent::TextDelta { index, text } => ("text", index, text).into_pyobject(py),
        ParseEvent::MessageDone { index, text } => ("message_done", index, text).into_pyobject(py),
        ParseEvent::ReasoningStart { index } => ("reasoning_start", index).into_pyobject(py),
        ParseEvent::ReasoningDelta { index, text } => ("reasoning", index, text).into_pyobject(py),
        ParseEvent::ReasoningDone { index, text } => ("reasoning_done", index, text).into_pyobject(py),
        ParseEvent::CallStart { index, name, call_id } => {
            ("call_start", index, name, call_id).into_pyobject(py)
        }
        ParseEvent::ArgumentsDelta { index, text } => ("arguments", index, text).into_pyobject(py),
        ParseEvent::CallDone {
            index,
            name,
            call_id,
            arguments,
        } => ("call_done", index, name, call_id, arguments).into_pyobject(py),
    }
}

fn event_list<'py>(py: Python<'py>, events: Vec<ParseEvent>) -> PyResult<Bound<'py, PyList>> {
    let tuples = events
        .into_iter()
        .map(|e| event_tuple(py, e))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, tuples)
}

/// The format's parser is `Send` but not `Sync`; the lock (never contended: one turn is
/// driven by one task) makes the class shareable as pyo3 requires.
#[pyclass(name = "OutputParser", module = "hotloop._core")]
struct PyOutputParser {
    inner: Mutex<TurnParser>,
}

impl PyOutputParser {
    fn parser(&self) -> MutexGuard<'_, TurnParser> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[pymethods]
impl PyOutputParser {
    fn feed<'py>(&self, py: Python<'py>, ids: Vec<u32>) -> PyResult<Bound<'py, PyList>> {
        let mut events = Vec::new();
        let mut parser = self.parser();
        for id in ids {
            parser.feed(id, &mut events);
        }
        drop(parser);
        event_list(py, events)
    }

    fn finish<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyList>, &'static str, Option<String>)> {
        let mut events = Vec::new();
        let (outcome, message) = match self.parser().finish(&mut events) {
            Outcome::Stopped => ("stopped", None),
            Outcome::Truncated => ("truncated", None),
            Outcome::Malformed(why) => ("malformed", Some(why)),
        };
        Ok((event_list(py, events)?, outcome, message))
    }

    #[getter]
    fn stopped(&self) -> bool {
        self.parser().stopped()
    }

    #[getter]
    fn output_tokens(&self) -> usize {
        self.parser().output_tokens()
    }

    #[getter]
    fn reasoning_tokens(&self) -> usize {
        self.parser().reasoning_tokens()
    }
}

/// A conversation of either kind of format (they offer the same methods).
enum AnyConversation {
    Items(Box<Conversation>),
    Template(Box<TemplateConversation>),
}

#[derive(Clone)]
enum AnyCheckpoint {
    Items(Checkpoint),
    Template(Box<TemplateCheckpoint>),
}

/// `$body` with `$c` bound to the conversation or checkpoint inside `$value`, whichever
/// kind it is.
macro_rules! either {
    ($kind:ident, $value:expr, $c:ident => $body:expr) => {
        match $value {
            $kind::Items($c) => $body,
            $kind::Template($c) => $body,
        }
    };
}

#[pyclass(name = "Checkpoint", module = "hotloop._core", frozen)]
struct PyCheckpoint {
    inner: AnyCheckpoint,
    policy: Option<Arc<Policy>>,
}

#[pymethods]
impl PyCheckpoint {
    #[getter]
    fn token_count(&self) -> usize {
        either!(AnyCheckpoint, &self.inner, c => c.token_count())
    }

    #[getter]
    fn memory_bytes(&self) -> usize {
        either!(AnyCheckpoint, &self.inner, c => c.memory_bytes())
    }

    fn fork(&self) -> PyConversation {
        PyConversation {
            inner: match &self.inner {
                AnyCheckpoint::Items(c) => AnyConversation::Items(Box::new(c.fork())),
                AnyCheckpoint::Template(c) => AnyConversation::Template(Box::new(c.fork())),
            },
            policy: self.policy.clone(),
        }
    }
}

/// Not frozen: `extend` and `append_items` hold a mutable borrow while the GIL is
/// released, so another thread using the same object meanwhile gets pyo3's
/// "already mutably borrowed" `RuntimeError`, never a data race (and pyo3 only accepts
/// the class because `Conversation` is `Send`).
#[pyclass(name = "Conversation", module = "hotloop._core")]
struct PyConversation {
    inner: AnyConversation,
    policy: Option<Arc<Policy>>,
}

#[pymethods]
impl PyConversation {
    #[new]
    #[pyo3(signature = (format, *, context_window, policy = None))]
    fn new(
        format: PyRef<'_, PyChatFormat>,
        context_window: usize,
        policy: Option<PyRef<'_, PyPolicy>>,
    ) -> Self {
        let inner = match &format.inner {
            FormatKind::Items(f) => {
                AnyConversation::Items(Box::new(Conversation::new(Arc::clone(f), context_window)))
            }
            FormatKind::Template(f) => {
                AnyConversation::Template(Box::new(TemplateConversation::new(Arc::clone(f), context_window)))
            }
        };
        PyConversation {
            inner,
            policy: policy.map(|p| Arc::clone(&p.inner)),
        }
    }

    /// Renders and tokenizes the request's new items; a large request (an agent's first
    /// request with its whole history, a large tool list or instructions) is worked on
    /// with the GIL released, so the server can run it in a worker thread while its
    /// event loop goes on.
    fn extend(&mut self, py: Python<'_>, request: PyRef<'_, PyCreateRequest>) -> PyResult<PyTurn> {
        let request = &request.inner;
        let (inner, policy) = (&mut self.inner, self.policy.as_deref());
        let turn = if request.frame_bytes >= RELEASE_GIL_BYTES {
            py.allow_threads(|| either!(AnyConversation, inner, c => c.extend_request(request, policy)))
        } else {
            either!(AnyConversation, inner, c => c.extend_request(request, policy))
        };
        Ok(turn?.into())
    }

    #[pyo3(signature = (items_json, *, instructions = None, tools_json = None))]
    fn append_items(
        &mut self,
        py: Python<'_>,
        items_json: &str,
        instructions: Option<String>,
        tools_json: Option<&str>,
    ) -> PyResult<PyTurn> {
        let inner = &mut self.inner;
        let turn = if items_json.len() >= RELEASE_GIL_BYTES {
            py.allow_threads(
                || either!(AnyConversation, inner, c => c.append_json(items_json, instructions, tools_json)),
            )
        } else {
            either!(AnyConversation, inner, c => c.append_json(items_json, instructions, tools_json))
        };
        Ok(turn?.into())
    }

    fn append_output(&mut self, items_json: &str, ids: Vec<u32>) -> PyResult<()> {
        Ok(either!(AnyConversation, &mut self.inner, c => c.append_output_json(items_json, &ids))?)
    }

    fn commit_items(&mut self, items_json: &str, ids: Vec<u32>) -> PyResult<()> {
        Ok(either!(AnyConversation, &mut self.inner, c => c.commit_items_json(items_json, &ids))?)
    }

    fn append_text(&mut self, chunk: &str) -> PyResult<usize> {
        Ok(either!(AnyConversation, &mut self.inner, c => c.append_text(chunk))?)
    }

    fn prompt(&self) -> PyPrompt {
        PyPrompt {
            inner: either!(AnyConversation, &self.inner, c => c.prompt()),
        }
    }

    /// The prompt with the generation prompt (the assistant turn's header), as an
    /// engine is given it to answer now; the conversation is unchanged.
    fn engine_prompt(&self) -> PyResult<PyPrompt> {
        let inner = match &self.inner {
            AnyConversation::Items(c) => c.engine_prompt(),
            AnyConversation::Template(c) => c.engine_prompt()?,
        };
        Ok(PyPrompt { inner })
    }

    fn parser(&self) -> PyResult<PyOutputParser> {
        Ok(PyOutputParser {
            inner: Mutex::new(either!(AnyConversation, &self.inner, c => c.parser())?),
        })
    }

    fn commit_output(&mut self, parser: PyRef<'_, PyOutputParser>) -> PyResult<()> {
        Ok(either!(AnyConversation, &mut self.inner, c => c.commit_output(&parser.parser()))?)
    }

    fn checkpoint(&mut self) -> PyCheckpoint {
        PyCheckpoint {
            inner: match &mut self.inner {
                AnyConversation::Items(c) => AnyCheckpoint::Items(c.checkpoint()),
                AnyConversation::Template(c) => AnyCheckpoint::Template(Box::new(c.checkpoint())),
            },
            policy: self.policy.clone(),
        }
    }

    #[getter]
    fn token_count(&self) -> usize {
        either!(AnyConversation, &self.inner, c => c.token_count())
    }

    #[getter]
    fn memory_bytes(&self) -> usize {
        either!(AnyConversation, &self.inner, c => c.memory_bytes())
    }

    #[getter]
    fn open_call_ids(&self) -> Vec<String> {
        either!(AnyConversation, &self.inner, c => c.open_call_ids())
    }

    /// Work counters: the item formats' (`segments_rendered`, ...) or a template's
    /// (`full_renders`, `window_renders`, `rewrites`, ...).
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        either!(AnyConversation, &self.inner, c => {
            for (name, value) in c.stats().pairs() {
                dict.set_item(name, value)?;
            }
        });
        Ok(dict)
    }
}

// ---------------------------------------------------------------- chat templates

use crate::format::template::cache::{Policy as TemplatePolicy, TemplatePrompt};
use crate::format::template::conversation::{TemplateCheckpoint, TemplateConversation, TemplateFormat};
use crate::format::template::messages::chat_tools;
use crate::format::template::specials::{ContentSpecials, Specials};
use crate::format::template::{ChatTemplate, RenderOptions};
use crate::format::toolcall::Family;

fn json_arg<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> PyResult<T> {
    serde_json::from_str(text)
        .map_err(|e| Error::new(Code::InvalidJson, format!("{what} is not valid JSON: {e}")).into())
}

fn render_options(tools_json: Option<&str>, kwargs_json: Option<&str>) -> PyResult<RenderOptions> {
    Ok(RenderOptions {
        tools: tools_json
            .map(|t| json_arg("tools", t).map(chat_tools))
            .transpose()?,
        kwargs: kwargs_json
            .map(|k| json_arg("template kwargs", k))
            .transpose()?
            .unwrap_or_default(),
    })
}

/// The ids from `start` on (none past the end).
fn ids_from(ids: &[u32], start: usize) -> Vec<u32> {
    ids.get(start..).unwrap_or_default().to_vec()
}

/// A Hugging Face chat template, rendered with transformers' semantics.
#[pyclass(name = "ChatTemplate", module = "hotloop._core", frozen)]
pub(crate) struct PyChatTemplate {
    inner: Arc<ChatTemplate>,
}

#[pymethods]
impl PyChatTemplate {
    #[staticmethod]
    #[pyo3(signature = (name, source, tokens = Vec::new()))]
    fn from_source(name: &str, source: &str, tokens: Vec<(String, String)>) -> PyResult<Self> {
        Ok(PyChatTemplate {
            inner: Arc::new(ChatTemplate::new(name, source, tokens)?),
        })
    }

    #[staticmethod]
    #[pyo3(signature = (data, name = "tokenizer_config", choose = None))]
    fn from_tokenizer_config(data: &[u8], name: &str, choose: Option<&str>) -> PyResult<Self> {
        Ok(PyChatTemplate {
            inner: Arc::new(ChatTemplate::from_tokenizer_config(name, data, choose)?),
        })
    }

    #[staticmethod]
    fn from_gguf(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let inner = py.allow_threads(|| ChatTemplate::from_gguf(&path))?;
        Ok(PyChatTemplate {
            inner: Arc::new(inner),
        })
    }

    /// The special-token strings a GGUF names (`[("bos_token", "<bos>"), ...]`), for
    /// `from_source` with a template given apart from the model file.
    #[staticmethod]
    fn gguf_tokens(py: Python<'_>, path: PathBuf) -> PyResult<Vec<(String, String)>> {
        Ok(py.allow_threads(|| ChatTemplate::gguf_tokens(&path))?)
    }

    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    #[getter]
    fn source(&self) -> &str {
        self.inner.source()
    }

    #[getter]
    fn tokens(&self) -> Vec<(String, String)> {
        self.inner.tokens().to_vec()
    }

    /// The same template rendered without its budget of steps and bytes: only for
    /// measuring what the budget costs (benches/bench_template_append.py).
    fn unbounded(&self) -> Self {
        PyChatTemplate {
            inner: Arc::new(self.inner.unbounded()),
        }
    }

    /// The tool-call parser the template's markers call for (`hermes`, ...), if any.
    #[getter]
    fn tool_parser(&self) -> Option<&'static str> {
        Family::detect(self.inner.source()).map(Family::name)
    }

    /// Render chat messages (a JSON array) to text.
    #[pyo3(signature = (messages_json, *, add_generation_prompt = false, tools_json = None, kwargs_json = None))]
    fn render(
        &self,
        py: Python<'_>,
        messages_json: &str,
        add_generation_prompt: bool,
        tools_json: Option<&str>,
        kwargs_json: Option<&str>,
    ) -> PyResult<String> {
        let messages: Vec<serde_json::Value> = json_arg("messages", messages_json)?;
        let options = render_options(tools_json, kwargs_json)?;
        Ok(py.allow_threads(|| self.inner.render(&messages, add_generation_prompt, &options))?)
    }

    fn __repr__(&self) -> String {
        format!("ChatTemplate({})", self.inner.name())
    }
}

/// One conversation's prompt under a chat template, rendered and tokenized by difference.
#[pyclass(name = "TemplatePrompt", module = "hotloop._core")]
pub(crate) struct PyTemplatePrompt {
    inner: TemplatePrompt,
    family: Option<Family>,
}

#[pymethods]
impl PyTemplatePrompt {
    #[new]
    #[pyo3(signature = (template, tokenizer, *, instructions = None, tools_json = None, kwargs_json = None,
                        window = true, check_every = 64, verbatim = false, tool_parser = None,
                        special_tokens_in_content = "plain"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        template: &PyChatTemplate,
        tokenizer: &PyTokenizer,
        instructions: Option<&str>,
        tools_json: Option<&str>,
        kwargs_json: Option<&str>,
        window: bool,
        check_every: u64,
        verbatim: bool,
        tool_parser: Option<&str>,
        special_tokens_in_content: &str,
    ) -> PyResult<Self> {
        let family = match tool_parser {
            None | Some("auto") => Family::detect(template.inner.source()),
            Some(name) => Some(Family::by_name(name)?),
        };
        let inner = TemplatePrompt::new(
            template.inner.clone(),
            Arc::new(Specials::new(
                tokenizer.inner.clone(),
                ContentSpecials::by_name(special_tokens_in_content)?,
            )),
            instructions,
            render_options(tools_json, kwargs_json)?,
            TemplatePolicy {
                window,
                check_every,
                verbatim,
            },
        );
        Ok(PyTemplatePrompt { inner, family })
    }

    /// Append chat messages (a JSON array) as they are.
    fn push_messages(&mut self, messages_json: &str) -> PyResult<()> {
        let messages: Vec<serde_json::Value> = json_arg("messages", messages_json)?;
        for m in messages {
            self.inner.push_message(m);
        }
        Ok(())
    }

    /// Append Responses-API input items (a JSON array), converted to chat messages as
    /// vLLM's Responses front end converts them.
    fn push_items(&mut self, items_json: &str) -> PyResult<()> {
        Ok(self.inner.push_items_json(items_json)?)
    }

    /// Verbatim mode: the ids the model sampled after the last prompt.
    fn push_output(&mut self, ids: Vec<u32>) {
        self.inner.push_output(&ids);
    }

    /// Bring the prompt up to date; returns how many leading ids were kept.
    #[pyo3(signature = (add_generation_prompt = true))]
    fn prompt(&mut self, py: Python<'_>, add_generation_prompt: bool) -> PyResult<usize> {
        let inner = &mut self.inner;
        Ok(py.allow_threads(|| inner.prompt(add_generation_prompt))?)
    }

    /// All ids (`ids_from(kept)` for the new ones).
    #[getter]
    fn ids(&self) -> Vec<u32> {
        self.inner.ids()
    }

    fn ids_from(&self, start: usize) -> Vec<u32> {
        let ids = self.inner.id_chunks();
        ids.to_vec(start, ids.len())
    }

    #[getter]
    fn text(&self) -> String {
        self.inner.text()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    #[getter]
    fn messages_json(&self) -> String {
        let messages: Vec<&serde_json::Value> = self.inner.messages().iter().map(|m| m.as_ref()).collect();
        serde_json::to_string(&messages).expect("messages serialize")
    }

    #[getter]
    fn template_name(&self) -> &str {
        self.inner.template().name()
    }

    /// Whether window renders are on, and why not (after the first prompt).
    #[getter]
    fn stability(&self) -> Option<(bool, Option<String>)> {
        let append_stable = self.inner.append_stable();
        self.inner.stability().map(|s| (append_stable, s.reason.clone()))
    }

    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, value) in self.inner.stats().pairs() {
            dict.set_item(name, value)?;
        }
        Ok(dict)
    }

    #[getter]
    fn tool_parser(&self) -> Option<&'static str> {
        self.family.map(Family::name)
    }

    #[getter]
    fn stop_tokens(&self) -> Vec<u32> {
        self.inner.stop_tokens()
    }

    /// The output parser for the turn the last prompt opened: the template's family
    /// (plain text when it has none), starting inside reasoning when the prompt ends by
    /// opening it.
    fn parser(&self) -> PyOutputParser {
        let tokenizer = self.inner.tokenizer().clone();
        let stop = self.inner.stop_tokens();
        let in_reasoning = self.inner.opens_reasoning();
        let family = self.family.unwrap_or(Family::Hermes);
        PyOutputParser {
            inner: Mutex::new(TurnParser::detached(family.parser(tokenizer, stop, in_reasoning))),
        }
    }
}

// ---------------------------------------------------------------- upstream streams

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

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CoreError", m.py().get_type::<CoreError>())?;
    m.add_class::<PyTokenizer>()?;
    m.add_class::<PyStreamDecoder>()?;
    m.add_class::<PyIncrementalText>()?;
    m.add_class::<PyChatFormat>()?;
    m.add_class::<PyLimits>()?;
    m.add_class::<PyPolicy>()?;
    m.add_class::<PyCreateRequest>()?;
    m.add_class::<PyCancelEvent>()?;
    m.add_class::<PyProcessedEvent>()?;
    m.add_class::<PyAppendEvent>()?;
    m.add_class::<PyUnknownEvent>()?;
    m.add_function(wrap_pyfunction!(parse_event, m)?)?;
    m.add_function(wrap_pyfunction!(parse_request, m)?)?;
    m.add_function(wrap_pyfunction!(check_values, m)?)?;
    m.add_class::<PyTurn>()?;
    m.add_class::<PyPrompt>()?;
    m.add_class::<PyOutputParser>()?;
    m.add_class::<PyCheckpoint>()?;
    m.add_class::<PyConversation>()?;
    m.add_class::<PyChatTemplate>()?;
    m.add_class::<PyTemplatePrompt>()?;
    m.add_class::<PyResponseReader>()?;
    m.add_class::<PyPromptBody>()?;
    Ok(())
}
