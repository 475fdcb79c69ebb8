//! Any Hugging Face chat template, rendered in Rust with transformers' semantics.
//!
//! - [`ChatTemplate`]: a template from `tokenizer_config.json`, a GGUF's
//!   `tokenizer.chat_template` or a `.jinja` file, rendered by minijinja in the
//!   environment transformers uses ([`env`]), with the variables `apply_chat_template`
//!   passes: `messages`, `tools`, `add_generation_prompt`, the special-token strings
//!   (`bos_token`, `eos_token`, ...) and the operator's template kwargs
//!   (`enable_thinking`, ...).
//! - [`messages`]: Responses-API items as the chat messages vLLM's Responses front end
//!   hands to the template.
//! - [`specials`]: the rendered text tokenized as `tokenizers.encode(text,
//!   add_special_tokens=False)` does: special tokens matched in the text, the text
//!   between them encoded as plain text.
//! - [`prompt`]: the incremental prompt: render, find the first changed byte, keep the
//!   tokens before it, tokenize the rest; render only the tail for append-stable templates.
//! - [`TemplateFormat`]: a template with its vocabulary, kwargs and tool-call parser, the
//!   generic chat format a conversation is built under (`prompt_chain::template`).
//!
//! This module owns rendering; it never decides what a model's output means (that is
//! the tool-call parsers in `format::toolcall`).

mod env;
mod format;
pub mod messages;
pub mod prompt;
pub mod pyjson;
pub mod specials;

use std::path::Path;
use std::sync::OnceLock;

use minijinja::value::Serde;
use minijinja::value::ValueKind;
use minijinja::{Environment, Value};
use serde_json::{json, Value as Json};

pub use format::TemplateFormat;
use messages::Arguments;

use crate::error::{Code, Error, Result};
use crate::tokenizer::{gguf, Tokenizer};

/// A compiled chat template with the special-token strings it is rendered with.
pub struct ChatTemplate {
    name: String,
    source: String,
    /// The compiled template, without a budget (cloned into `budgeted`).
    env: Environment<'static>,
    /// `env` with a budget of `FUEL_BASE << k` fuel at index k, made on first use.
    budgeted: [OnceLock<Environment<'static>>; FUEL_TIERS],
    /// Renders run without a budget (benchmarks measure what the budget costs).
    unbounded: bool,
    /// `bos_token`, `eos_token`, ... as `apply_chat_template` passes them.
    tokens: Vec<(String, String)>,
    /// How this template is given a call's arguments, decided once when it is loaded.
    arguments: Arguments,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("name", &self.name).finish()
    }
}

/// What one render is given besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Tool definitions in the chat-completions shape (`{"type": "function", "function": {...}}`);
    /// None renders `tools=None`.
    pub tools: Option<Vec<Json>>,
    /// Template kwargs (`enable_thinking`, `reasoning_effort`, ...), set last so they
    /// override anything else of the same name, as in transformers.
    pub kwargs: serde_json::Map<String, Json>,
}

impl ChatTemplate {
    /// Compile `source`. `tokens` are the special-token variables (`bos_token`, ...).
    pub fn new(name: &str, source: &str, tokens: Vec<(String, String)>) -> Result<ChatTemplate> {
        let env = env::environment(source).map_err(|e| {
            Error::new(
                Code::InvalidTemplate,
                format!("chat template {name} does not compile: {e:#}"),
            )
        })?;
        let mut template = ChatTemplate {
            name: name.to_owned(),
            source: source.to_owned(),
            env,
            budgeted: Default::default(),
            unbounded: false,
            tokens,
            arguments: Arguments::Parsed,
        };
        template.arguments = template.argument_form();
        Ok(template)
    }

    /// Parsed arguments (vLLM's form), unless the template fails on a call with parsed
    /// arguments and renders it with their JSON text: DeepSeek V3's writes
    /// `'\n' + tool['function']['arguments']`, which only text can be added to.
    fn argument_form(&self) -> Arguments {
        let renders = |form: Arguments| {
            let call = json!({"id": "probecall", "type": "function",
                              "function": {"name": "probe_tool", "arguments": form.value(r#"{"q": 1}"#)}});
            let messages = [
                json!({"role": "user", "content": "Question?"}),
                json!({"role": "assistant", "content": "", "tool_calls": [call]}),
                json!({"role": "tool", "content": "result", "tool_call_id": "probecall"}),
            ];
            self.render(&messages, true, &RenderOptions::default()).is_ok()
        };
        if !renders(Arguments::Parsed) && renders(Arguments::Text) {
            Arguments::Text
        } else {
            Arguments::Parsed
        }
    }

    /// How this template is given a call's arguments.
    pub fn arguments(&self) -> Arguments {
        self.arguments
    }

    /// The same template rendered without a budget: only for measuring what the
    /// budget costs (a template from anywhere must never be served this way).
    pub fn unbounded(&self) -> ChatTemplate {
        ChatTemplate {
            name: self.name.clone(),
            source: self.source.clone(),
            env: self.env.clone(),
            budgeted: Default::default(),
            unbounded: true,
            tokens: self.tokens.clone(),
            arguments: self.arguments,
        }
    }

    /// The environment whose fuel covers a render of `input_bytes` of messages and
    /// tools: [`FUEL_BASE`] plus [`FUEL_PER_INPUT_BYTE`] per byte, rounded up to a
    /// power of two so a few environments serve every size.
    fn environment(&self, input_bytes: u64) -> &Environment<'static> {
        if self.unbounded {
            return &self.env;
        }
        let budget = FUEL_BASE.saturating_add(input_bytes.saturating_mul(FUEL_PER_INPUT_BYTE));
        let tier =
            (budget.div_ceil(FUEL_BASE).next_power_of_two().trailing_zeros() as usize).min(FUEL_TIERS - 1);
        self.budgeted[tier].get_or_init(|| {
            let mut env = self.env.clone();
            env.set_fuel(Some(FUEL_BASE << tier));
            env
        })
    }

    /// The template of a Hugging Face `tokenizer_config.json`: `chat_template` as a
    /// string, or the `default` entry of a list of named templates (transformers picks
    /// `tool_use` when tools are given; hotloop renders one template per conversation,
    /// so a config with both is served with `default` unless `name` selects another).
    pub fn from_tokenizer_config(name: &str, data: &[u8], choose: Option<&str>) -> Result<ChatTemplate> {
        let invalid = |m: String| Error::new(Code::InvalidTemplate, m);
        let config: Json = serde_json::from_slice(data)
            .map_err(|e| invalid(format!("tokenizer_config.json is not JSON: {e}")))?;
        let source = match config.get("chat_template") {
            Some(Json::String(s)) => s.clone(),
            Some(Json::Array(named)) => {
                let wanted = choose.unwrap_or("default");
                named
                    .iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some(wanted))
                    .and_then(|t| t.get("template"))
                    .and_then(Json::as_str)
                    .ok_or_else(|| {
                        invalid(format!(
                            "tokenizer_config.json has no chat template named {wanted}"
                        ))
                    })?
                    .to_owned()
            }
            _ => return Err(invalid("tokenizer_config.json has no chat_template".into())),
        };
        let mut tokens = Vec::new();
        for key in [
            "bos_token",
            "eos_token",
            "unk_token",
            "pad_token",
            "sep_token",
            "cls_token",
            "mask_token",
        ] {
            // A token is a string or an AddedToken object with its text in `content`.
            let text = match config.get(key) {
                Some(Json::String(s)) => Some(s.clone()),
                Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).map(str::to_owned),
                _ => None,
            };
            if let Some(text) = text {
                tokens.push((key.to_owned(), text));
            }
        }
        ChatTemplate::new(name, &source, tokens)
    }

    /// The template a GGUF carries in `tokenizer.chat_template`, with its BOS/EOS strings.
    pub fn from_gguf(path: &Path) -> Result<ChatTemplate> {
        let meta = gguf::read_metadata_file(path)?;
        let source = meta
            .get("tokenizer.chat_template")
            .and_then(gguf::Value::as_str)
            .ok_or_else(|| {
                Error::new(
                    Code::InvalidTemplate,
                    format!("{} has no tokenizer.chat_template", path.display()),
                )
            })?;
        let tokens = gguf_token_strings(&meta);
        let name = meta
            .get("general.name")
            .and_then(gguf::Value::as_str)
            .unwrap_or("gguf")
            .to_owned();
        ChatTemplate::new(&name, source, tokens)
    }

    /// The special-token strings (`bos_token`, `eos_token`, ...) a GGUF names, for a
    /// template given apart from it (a base model's GGUF carries none).
    pub fn gguf_tokens(path: &Path) -> Result<Vec<(String, String)>> {
        Ok(gguf_token_strings(&gguf::read_metadata_file(path)?))
    }

    /// A `.jinja` file, rendered with these special-token strings.
    pub fn from_file(path: &Path, tokens: Vec<(String, String)>) -> Result<ChatTemplate> {
        let source = std::fs::read_to_string(path).map_err(|e| {
            Error::new(
                Code::InvalidTemplate,
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("template");
        ChatTemplate::new(name, &source, tokens)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The ids that end an assistant turn: the template's `eos_token` and the
    /// end-of-turn tokens of the families, those the vocabulary has.
    pub fn stop_tokens(&self, tokenizer: &dyn Tokenizer) -> Vec<u32> {
        let eos = self
            .tokens
            .iter()
            .find(|(k, _)| k == "eos_token")
            .map(|(_, v)| v.as_str());
        let mut stop: Vec<u32> = Vec::new();
        for name in eos.into_iter().chain(END_OF_TURN.iter().copied()) {
            if let Some(id) = tokenizer.special(name) {
                if !stop.contains(&id) {
                    stop.push(id);
                }
            }
        }
        stop
    }

    /// The special-token strings the template is rendered with (`bos_token`, ...).
    pub fn tokens(&self) -> &[(String, String)] {
        &self.tokens
    }

    /// Render `messages` (already converted to template values, see [`message_value`]).
    pub fn render_values(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
        options: &RenderOptions,
    ) -> Result<String> {
        let input_bytes = messages.iter().map(value_bytes).sum::<u64>()
            + options.tools.iter().flatten().map(json_bytes).sum::<u64>();
        let template = self
            .environment(input_bytes)
            .get_template(env::TEMPLATE)
            .expect("the environment holds the template");
        let mut context: Vec<(String, Value)> = self
            .tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        context.push(("messages".into(), Value::from(messages.to_vec())));
        context.push((
            "tools".into(),
            match &options.tools {
                Some(tools) => Value::from(Serde(tools)),
                None => Value::from(()),
            },
        ));
        context.push(("documents".into(), Value::from(())));
        context.push(("add_generation_prompt".into(), Value::from(add_generation_prompt)));
        for (k, v) in &options.kwargs {
            context.push((k.clone(), Value::from(Serde(v))));
        }
        // Later entries win, as the caller's kwargs do in transformers.
        let context: std::collections::BTreeMap<String, Value> = context.into_iter().collect();
        template
            .render(Value::from(context))
            .map_err(|e| Error::new(Code::TemplateError, render_error(&self.name, &e)))
    }

    /// Render chat messages given as JSON.
    pub fn render(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
        options: &RenderOptions,
    ) -> Result<String> {
        let values: Vec<Value> = messages.iter().map(message_value).collect();
        self.render_values(&values, add_generation_prompt, options)
    }
}

/// The fuel every render may use whatever its input: about a million instructions or
/// 64 MB of strings and lists made (minijinja charges one fuel per instruction and per
/// 64 bytes it creates or processes, and refuses an allocation it cannot pay for), so a
/// template from anywhere cannot loop for hours or double a string until the process
/// aborts. Real templates use a few thousand for a short conversation.
const FUEL_BASE: u64 = 1 << 20;

/// Fuel per byte of input (message and tool text, and [`NODE_BYTES`] per value): a
/// long conversation may render long, at most a fixed multiple of what it holds.
const FUEL_PER_INPUT_BYTE: u64 = 4;

/// What one value (a message, a key, a number) counts as, in input bytes: templates
/// spend instructions per value, not per byte of text.
const NODE_BYTES: u64 = 64;

/// Budgets of `FUEL_BASE << k` for k below this; the last is a ceiling (2^20 << 23 fuel
/// is half a terabyte of data: more than any input needs, far less than unbounded).
const FUEL_TIERS: usize = 24;

/// The input size of a template value, in bytes as the fuel budget counts them.
fn value_bytes(value: &Value) -> u64 {
    NODE_BYTES
        + match value.kind() {
            ValueKind::String => value.as_str().map_or(0, |s| s.len() as u64),
            ValueKind::Seq => value
                .try_iter()
                .into_iter()
                .flatten()
                .map(|v| value_bytes(&v))
                .sum(),
            ValueKind::Map => value
                .try_iter()
                .into_iter()
                .flatten()
                .map(|k| value_bytes(&k) + value.get_item(&k).map_or(0, |v| value_bytes(&v)))
                .sum(),
            _ => 0,
        }
}

/// The input size of a JSON value (tool definitions), counted as [`value_bytes`] does.
fn json_bytes(value: &Json) -> u64 {
    NODE_BYTES
        + match value {
            Json::String(s) => s.len() as u64,
            Json::Array(a) => a.iter().map(json_bytes).sum(),
            Json::Object(o) => o
                .iter()
                .map(|(k, v)| NODE_BYTES + k.len() as u64 + json_bytes(v))
                .sum(),
            _ => 0,
        }
}

/// End-of-turn tokens of the families (ChatML, Llama 3, Gemma, Phi, DeepSeek, Mistral, harmony).
const END_OF_TURN: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
    "<｜end▁of▁sentence｜>",
    "</s>",
    "<|return|>",
    "<|call|>",
];

/// `bos_token`, `eos_token`, ... as the texts of the ids a GGUF's metadata names.
fn gguf_token_strings(meta: &gguf::Metadata) -> Vec<(String, String)> {
    let vocab = meta.get("tokenizer.ggml.tokens").and_then(gguf::Value::as_array);
    let token_text = |key: &str| {
        let id = meta.get(key)?.as_int()?;
        vocab?.get(usize::try_from(id).ok()?)?.as_str().map(str::to_owned)
    };
    let mut tokens = Vec::new();
    for (var, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(text) = token_text(key) {
            tokens.push((var.to_owned(), text));
        }
    }
    tokens
}

/// A chat message as the template sees it.
pub fn message_value(message: &Json) -> Value {
    Value::from(Serde(message))
}

/// The message of a failed render: `raise_exception`'s own text, else minijinja's
/// description with the template line.
fn render_error(name: &str, e: &minijinja::Error) -> String {
    match (e.kind(), e.detail()) {
        (minijinja::ErrorKind::OutOfFuel, _) => format!(
            "chat template {name} exceeded its budget (the steps and bytes a render of \
             this conversation may use): the template loops or builds text without bound"
        ),
        (minijinja::ErrorKind::InvalidOperation, Some(detail)) => {
            format!("chat template {name}: {detail}")
        }
        _ => format!("chat template {name} failed to render: {e:#}"),
    }
}

#[cfg(test)]
mod prompt_tests;
#[cfg(test)]
mod tests;
