//! Chat templates: `ChatTemplate` (a Hugging Face template rendered with transformers'
//! semantics) and `TemplatePrompt` (one prompt under it, rendered and tokenized by
//! difference).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::super::json_arg;
use super::super::prompt_chain::PyOutputParser;
use super::super::tokenizer::PyTokenizer;
use crate::format::template::messages::chat_tools;
use crate::format::template::prompt::{Policy as TemplatePolicy, TemplatePrompt};
use crate::format::template::specials::{ContentSpecials, Specials};
use crate::format::template::{ChatTemplate, RenderOptions};
use crate::format::toolcall::Family;
use crate::prompt_chain::TurnParser;

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

/// A Hugging Face chat template, rendered with transformers' semantics.
#[pyclass(name = "ChatTemplate", module = "hotloop._core", frozen)]
pub(crate) struct PyChatTemplate {
    pub(super) inner: Arc<ChatTemplate>,
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

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyChatTemplate>()?;
    m.add_class::<PyTemplatePrompt>()
}
