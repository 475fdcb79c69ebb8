//! `ChatFormat`: how items become prompt tokens and sampled tokens become items, for
//! the item formats (harmony, ChatML) and a model's own chat template (`template`).

pub(super) mod template;

use std::sync::Arc;

use pyo3::prelude::*;

use super::json_arg;
use super::tokenizer::PyTokenizer;
use crate::format::chatml::ChatMl;
use crate::format::harmony::Harmony;
use crate::format::template::prompt::Policy as TemplatePolicy;
use crate::format::template::specials::ContentSpecials;
use crate::format::template::TemplateFormat;
use crate::format::ChatFormat;
use crate::item::{Item, Role};
use crate::render::Renderer;
use template::PyChatTemplate;

/// The two kinds of chat format: rendered item by item (harmony, ChatML), or through
/// a model's own chat template.
#[derive(Clone)]
pub(super) enum FormatKind {
    Items(Arc<dyn ChatFormat>),
    Template(Arc<TemplateFormat>),
}

/// A chat format: how items become prompt tokens and sampled tokens become items.
#[pyclass(name = "ChatFormat", module = "hotloop._core", frozen)]
pub(crate) struct PyChatFormat {
    pub(super) inner: FormatKind,
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

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyChatFormat>()?;
    template::register(m)
}
