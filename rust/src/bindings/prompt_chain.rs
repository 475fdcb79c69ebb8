//! The prompt chain (`crate::prompt_chain`): `Conversation` and its `Checkpoint`s, the
//! `Turn` an append reports, the `Prompt` it holds, and the `OutputParser` of an open
//! turn.

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::format::{FormatKind, PyChatFormat};
use super::validate::{PyCreateRequest, PyPolicy};
use super::RELEASE_GIL_BYTES;
use crate::error::{Code, Error};
use crate::format::{Outcome, ParseEvent};
use crate::prompt_chain::{
    Checkpoint, Conversation, Prompt, SegmentBuilder, TemplateBuilder, Turn, TurnParser,
};
use crate::validate::Policy;

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
pub(super) struct PyPrompt {
    pub(super) inner: Prompt,
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
pub(super) struct PyOutputParser {
    pub(super) inner: Mutex<TurnParser>,
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

#[pyclass(name = "Checkpoint", module = "hotloop._core", frozen)]
struct PyCheckpoint {
    inner: Checkpoint,
    policy: Option<Arc<Policy>>,
}

#[pymethods]
impl PyCheckpoint {
    #[getter]
    fn token_count(&self) -> usize {
        self.inner.token_count()
    }

    #[getter]
    fn memory_bytes(&self) -> usize {
        self.inner.memory_bytes()
    }

    fn fork(&self) -> PyConversation {
        PyConversation {
            inner: self.inner.fork(),
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
    inner: Conversation,
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
            FormatKind::Items(f) => Conversation::new(SegmentBuilder::new(Arc::clone(f)), context_window),
            FormatKind::Template(f) => Conversation::new(TemplateBuilder::new(Arc::clone(f)), context_window),
        };
        PyConversation {
            inner,
            policy: policy.map(|p| Arc::clone(&p.inner)),
        }
    }

    /// Renders and tokenizes the request's new items; a large request (an agent's first
    /// request with its whole history, a large tool list or instructions) is worked on
    /// with the GIL released, so the server can run it in a worker thread while its
    /// event loop goes on. `skip`: the request's first items are already in this
    /// conversation (a state found by their history digests): only the rest is checked
    /// and rendered.
    #[pyo3(signature = (request, skip = 0))]
    fn extend(
        &mut self,
        py: Python<'_>,
        request: PyRef<'_, PyCreateRequest>,
        skip: usize,
    ) -> PyResult<PyTurn> {
        let whole = &request.inner;
        if skip < whole.history.seen.items {
            // Its first items were not parsed: only a state holding them can take it.
            return Err(Error::new(
                Code::InvalidValue,
                "the request's first items were recognized, not parsed: it continues a state holding them",
            )
            .into());
        }
        let tail = (skip > 0).then(|| whole.tail(skip));
        let request = tail.as_ref().unwrap_or(whole);
        let (inner, policy) = (&mut self.inner, self.policy.as_deref());
        let turn = if whole.frame_bytes >= RELEASE_GIL_BYTES {
            py.allow_threads(|| inner.extend_request(request, policy))
        } else {
            inner.extend_request(request, policy)
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
            py.allow_threads(|| inner.append_json(items_json, instructions, tools_json))
        } else {
            inner.append_json(items_json, instructions, tools_json)
        };
        Ok(turn?.into())
    }

    fn append_output(&mut self, items_json: &str, ids: Vec<u32>) -> PyResult<()> {
        Ok(self.inner.append_output_json(items_json, &ids)?)
    }

    fn commit_items(&mut self, items_json: &str, ids: Vec<u32>) -> PyResult<()> {
        Ok(self.inner.commit_items_json(items_json, &ids)?)
    }

    fn append_text(&mut self, chunk: &str) -> PyResult<usize> {
        Ok(self.inner.append_text(chunk)?)
    }

    fn prompt(&self) -> PyPrompt {
        PyPrompt {
            inner: self.inner.prompt(),
        }
    }

    /// The prompt with the generation prompt (the assistant turn's header), as an
    /// engine is given it to answer now; the conversation is unchanged.
    fn engine_prompt(&self) -> PyResult<PyPrompt> {
        Ok(PyPrompt {
            inner: self.inner.engine_prompt()?,
        })
    }

    fn parser(&self) -> PyResult<PyOutputParser> {
        Ok(PyOutputParser {
            inner: Mutex::new(self.inner.parser()?),
        })
    }

    fn commit_output(&mut self, parser: PyRef<'_, PyOutputParser>) -> PyResult<()> {
        Ok(self.inner.commit_output(&parser.parser())?)
    }

    fn checkpoint(&mut self) -> PyCheckpoint {
        PyCheckpoint {
            inner: self.inner.checkpoint(),
            policy: self.policy.clone(),
        }
    }

    #[getter]
    fn token_count(&self) -> usize {
        self.inner.token_count()
    }

    #[getter]
    fn memory_bytes(&self) -> usize {
        self.inner.memory_bytes()
    }

    #[getter]
    fn open_call_ids(&self) -> Vec<String> {
        self.inner.open_call_ids()
    }

    /// Work counters: the item formats' (`segments_rendered`, ...) or a template's
    /// (`full_renders`, `window_renders`, `rewrites`, ...).
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, value) in self.inner.stats() {
            dict.set_item(name, value)?;
        }
        Ok(dict)
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTurn>()?;
    m.add_class::<PyPrompt>()?;
    m.add_class::<PyOutputParser>()?;
    m.add_class::<PyCheckpoint>()?;
    m.add_class::<PyConversation>()
}
