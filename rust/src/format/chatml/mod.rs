//! ChatML (SmolLM2, Qwen): `<|im_start|>role\ncontent<|im_end|>\n` turns, with tools in
//! Qwen2.5's form (`<tools>` in the system turn, `<tool_call>` blocks in assistant turns,
//! `<tool_response>` blocks in user turns).
//!
//! Renders what the model's Jinja template renders (SmolLM2-135M-Instruct's, and
//! Qwen2.5's for tools), tokenized as llama.cpp tokenizes it: text between special tokens
//! is one run. Templates merge neighbours into one turn (an assistant text and its calls;
//! consecutive tool results), so an item that may be continued leaves its turn open and
//! the next segment (or the generation header) starts with the closing `<|im_end|>\n`.
//! A segment's tokens thus never depend on what follows. Where a continuation joins text
//! to text (`...</tool_call>` + `\n<tool_call>...`), a renderer that carries its open run
//! into the next segment (the conversation cache does) tokenizes the join exactly; encoded
//! on their own, the segments still match for pre-tokenizers of the GPT-2 family
//! (SmolLM2's), which always split before the `\n<` of the join.
//!
//! Differences from the templates, by design: developer messages render as `system`
//! turns; with no instructions the default system turn belongs to the prefix, so a
//! leading system item follows it instead of replacing it.

mod json;
mod parser;

use std::sync::Arc;

use serde_json::Value;

use super::output::MarkupParser;
use super::{ChatFormat, Context, OutputParser};
use crate::error::{Code, Error, Result};
use crate::item::{Item, ItemKind, Prefix, Role, Tool};
use crate::render::Renderer;
use crate::tokenizer::Tokenizer;

pub use json::tojson;
pub use parser::ChatMlParser;

const TOOLS_INTRO: &str =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
const TOOLS_OUTRO: &str =
    "\n</tools>\n\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
<args-json-object>}\n</tool_call>";

pub struct ChatMl {
    tokenizer: Arc<dyn Tokenizer>,
    im_start: u32,
    im_end: u32,
    /// `<|im_end|>`, then `<|endoftext|>` when the vocabulary has it.
    stop: Vec<u32>,
    default_system: Option<String>,
}

impl ChatMl {
    /// ChatML over `tokenizer`, which must have `<|im_start|>` and `<|im_end|>`.
    /// `default_system` is the system turn the template inserts when there is none.
    pub fn new(tokenizer: Arc<dyn Tokenizer>, default_system: Option<String>) -> Result<ChatMl> {
        let special = |name: &str| {
            tokenizer.special(name).ok_or_else(|| {
                Error::new(
                    Code::InvalidVocabulary,
                    format!(
                        "tokenizer {} has no {name} token, which ChatML needs",
                        tokenizer.name()
                    ),
                )
            })
        };
        let im_start = special("<|im_start|>")?;
        let im_end = special("<|im_end|>")?;
        let mut stop = vec![im_end];
        stop.extend(tokenizer.special("<|endoftext|>").filter(|&id| id != im_end));
        Ok(ChatMl {
            tokenizer,
            im_start,
            im_end,
            stop,
            default_system,
        })
    }

    /// A whole turn: `<|im_start|>role\ntext<|im_end|>\n`.
    fn turn(&self, role: &str, text: &str, r: &mut Renderer) {
        r.special(self.im_start);
        r.text(role);
        r.text("\n");
        r.text(text);
        self.end_turn(r);
    }

    fn end_turn(&self, r: &mut Renderer) {
        r.special(self.im_end);
        r.text("\n");
    }

    /// Close the turn the previous item left open, unless this item continues it.
    fn close_open_turn(&self, prev: Option<ItemKind>, continues: bool, r: &mut Renderer) {
        let open = matches!(
            prev,
            Some(ItemKind::Message(Role::Assistant) | ItemKind::FunctionCall | ItemKind::FunctionCallOutput)
        );
        if open && !continues {
            self.end_turn(r);
        }
    }

    fn tool_call(&self, name: &str, arguments: &str, r: &mut Renderer) {
        r.text("<tool_call>\n{\"name\": \"");
        r.text(name);
        r.text("\", \"arguments\": ");
        // The template writes `arguments | tojson` of the parsed object.
        match serde_json::from_str::<Value>(arguments) {
            Ok(value) => r.text(&tojson(&value)),
            Err(_) => r.text(arguments),
        }
        r.text("}\n</tool_call>");
    }
}

fn tool_json(tool: &Tool) -> String {
    let mut function = serde_json::Map::new();
    function.insert("name".into(), Value::String(tool.name.clone()));
    if let Some(description) = &tool.description {
        function.insert("description".into(), Value::String(description.clone()));
    }
    if !tool.parameters.is_null() {
        function.insert("parameters".into(), tool.parameters.clone());
    }
    let mut wrapper = serde_json::Map::new();
    wrapper.insert("type".into(), Value::String("function".into()));
    wrapper.insert("function".into(), Value::Object(function));
    tojson(&Value::Object(wrapper))
}

impl ChatFormat for ChatMl {
    fn name(&self) -> &str {
        "chatml"
    }

    fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        &self.tokenizer
    }

    fn render_prefix(&self, prefix: &Prefix, r: &mut Renderer) {
        let system = prefix.instructions.as_deref().or(self.default_system.as_deref());
        if !prefix.tools.is_empty() {
            r.special(self.im_start);
            r.text("system\n");
            r.text(system.unwrap_or_default());
            r.text(TOOLS_INTRO);
            for tool in &prefix.tools {
                r.text("\n");
                r.text(&tool_json(tool));
            }
            r.text(TOOLS_OUTRO);
            self.end_turn(r);
        } else if let Some(system) = system {
            self.turn("system", system, r);
        }
    }

    fn render_item(&self, ctx: &Context, item: &Item, r: &mut Renderer) {
        match item {
            Item::Message { role, text } => {
                self.close_open_turn(ctx.prev, false, r);
                match role {
                    Role::System | Role::Developer => self.turn("system", text, r),
                    Role::User => self.turn("user", text, r),
                    // Left open: calls may follow in the same turn.
                    Role::Assistant => {
                        r.special(self.im_start);
                        r.text("assistant\n");
                        r.text(text);
                    }
                }
            }
            Item::FunctionCall { name, arguments, .. } => {
                let continues = matches!(
                    ctx.prev,
                    Some(ItemKind::Message(Role::Assistant) | ItemKind::FunctionCall)
                );
                self.close_open_turn(ctx.prev, continues, r);
                if !continues {
                    r.special(self.im_start);
                    r.text("assistant");
                }
                r.text("\n");
                self.tool_call(name, arguments, r);
            }
            Item::FunctionCallOutput { output, .. } => {
                let continues = ctx.prev == Some(ItemKind::FunctionCallOutput);
                self.close_open_turn(ctx.prev, continues, r);
                if !continues {
                    r.special(self.im_start);
                    r.text("user");
                }
                r.text("\n<tool_response>\n");
                r.text(output);
                r.text("\n</tool_response>");
            }
            // ChatML has no reasoning channel: replayed reasoning is not shown to the model.
            Item::Reasoning { .. } => self.close_open_turn(ctx.prev, false, r),
        }
    }

    fn render_generation_header(&self, ctx: &Context, r: &mut Renderer) {
        self.close_open_turn(ctx.prev, false, r);
        r.special(self.im_start);
        r.text("assistant\n");
    }

    /// The sampled ids without their stop token: like a rendered assistant item, the
    /// turn stays open and the next segment closes it with `<|im_end|>\n`.
    fn render_output(&self, sampled: &[u32], r: &mut Renderer) {
        match sampled.split_last() {
            Some((last, body)) if self.stop.contains(last) => r.ids(body),
            _ => r.ids(sampled),
        }
    }

    fn stop_tokens(&self) -> &[u32] {
        &self.stop
    }

    fn parser(&self) -> Box<dyn OutputParser> {
        Box::new(MarkupParser::new(ChatMlParser::new(
            self.tokenizer.clone(),
            self.stop.clone(),
            self.im_start,
        )))
    }

    /// Text, then `<tool_call>` blocks, as one run, then `<|im_end|>`. Reasoning has no
    /// place in ChatML and is left out.
    fn render_completion(&self, items: &[Item], r: &mut Renderer) {
        let mut first = true;
        for item in items {
            match item {
                Item::Message { text, .. } => r.text(text),
                Item::FunctionCall { name, arguments, .. } => {
                    if !first {
                        r.text("\n");
                    }
                    self.tool_call(name, arguments, r);
                }
                Item::Reasoning { .. } | Item::FunctionCallOutput { .. } => continue,
            }
            first = false;
        }
        r.special(self.im_end);
    }
}

#[cfg(test)]
pub(crate) mod tests;
