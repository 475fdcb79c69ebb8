//! [`TemplateFormat`]: a chat template with its vocabulary, template kwargs and tool-call
//! parser, the generic chat format. It says how a request's prefix and items are given
//! to the template (`options`, `template_items`) and what the model samples for given
//! items; a conversation under it is built by `prompt_chain::template`.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use super::messages::tool_definitions;
use super::prompt::Policy as RenderPolicy;
use super::specials::{ContentSpecials, Specials};
use super::{ChatTemplate, RenderOptions};
use crate::error::{Code, Error, Result};
use crate::format::toolcall::Family;
use crate::item::{Item, Prefix};
use crate::tokenizer::Tokenizer;

/// The length of the call ids Mistral's templates accept.
const MISTRAL_CALL_ID: usize = 9;

/// A chat template with its vocabulary, template kwargs and tool-call parser: the
/// generic chat format.
pub struct TemplateFormat {
    template: Arc<ChatTemplate>,
    specials: Arc<Specials>,
    kwargs: Map<String, Json>,
    family: Option<Family>,
    policy: RenderPolicy,
    stop: Vec<u32>,
}

impl TemplateFormat {
    /// `tool_parser`: None or `auto` picks the family from the template's markers;
    /// `content`: what special-token text in content becomes.
    pub fn new(
        template: Arc<ChatTemplate>,
        tokenizer: Arc<dyn Tokenizer>,
        kwargs: Map<String, Json>,
        tool_parser: Option<&str>,
        policy: RenderPolicy,
        content: ContentSpecials,
    ) -> Result<TemplateFormat> {
        let family = match tool_parser {
            None | Some("auto") => Family::detect(template.source()),
            Some(name) => Some(Family::by_name(name)?),
        };
        let stop = template.stop_tokens(tokenizer.as_ref());
        if stop.is_empty() {
            return Err(Error::new(
                Code::InvalidTemplate,
                format!(
                    "chat template {}: the vocabulary has no end-of-turn token (its eos_token or a family's)",
                    template.name()
                ),
            ));
        }
        Ok(TemplateFormat {
            template,
            specials: Arc::new(Specials::new(tokenizer, content)),
            kwargs,
            family,
            policy,
            stop,
        })
    }

    pub fn name(&self) -> &str {
        self.template.name()
    }

    pub fn template(&self) -> &Arc<ChatTemplate> {
        &self.template
    }

    /// The vocabulary with the special tokens content may (or may not) spell.
    pub fn specials(&self) -> &Arc<Specials> {
        &self.specials
    }

    pub fn policy(&self) -> RenderPolicy {
        self.policy
    }

    pub fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        self.specials.tokenizer()
    }

    pub fn stop_tokens(&self) -> &[u32] {
        &self.stop
    }

    /// The parser family: the operator's choice, else the template's markers, else
    /// Hermes (`<think>` and `<tool_call>` read; plain text passes through it unchanged).
    pub fn family(&self) -> Family {
        self.family.unwrap_or(Family::Hermes)
    }

    /// The render options of a request prefix: its tools as chat tool definitions, the
    /// operator's kwargs, and `reasoning_effort` from the request unless the operator
    /// set it.
    pub fn options(&self, prefix: &Prefix) -> RenderOptions {
        let mut kwargs = self.kwargs.clone();
        if let Some(effort) = &prefix.reasoning_effort {
            kwargs
                .entry("reasoning_effort")
                .or_insert_with(|| Json::String(effort.clone()));
        }
        RenderOptions {
            tools: (!prefix.tools.is_empty()).then(|| tool_definitions(&prefix.tools)),
            kwargs,
        }
    }

    /// Items as the template is given them. Mistral's templates accept only 9-character
    /// call ids: vLLM's Mistral parser mints such ids and truncates longer ones to their
    /// last 9 characters (`truncate_tool_call_ids`), and so does this.
    pub fn template_items<'a>(&self, items: &'a [Item]) -> Cow<'a, [Item]> {
        if self.family != Some(Family::Mistral) {
            return Cow::Borrowed(items);
        }
        let short = |id: &str| {
            let cut = id
                .char_indices()
                .rev()
                .nth(MISTRAL_CALL_ID - 1)
                .map_or(0, |(i, _)| i);
            id[cut..].to_owned()
        };
        Cow::Owned(
            items
                .iter()
                .map(|item| match item {
                    Item::FunctionCall {
                        call_id,
                        name,
                        arguments,
                    } => Item::FunctionCall {
                        call_id: short(call_id),
                        name: name.clone(),
                        arguments: arguments.clone(),
                    },
                    Item::FunctionCallOutput { call_id, output } => Item::FunctionCallOutput {
                        call_id: short(call_id),
                        output: output.clone(),
                    },
                    other => other.clone(),
                })
                .collect(),
        )
    }

    /// The ids a model of this family samples to produce `items`, ending with the stop
    /// token (the simulated engine's answers).
    pub fn completion_tokens(&self, items: &[Item]) -> Vec<u32> {
        let mut ids = self.specials.encode_all(&self.family().completion_text(items));
        ids.push(self.stop[0]);
        ids
    }
}
