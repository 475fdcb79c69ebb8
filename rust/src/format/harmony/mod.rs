//! Harmony, gpt-oss's chat format, over the `o200k_harmony` encoding.
//!
//! Renders token for token what openai-harmony's `render_conversation_for_completion`
//! renders (with `auto_drop_analysis=False`): every header and content piece is its own
//! [`Renderer::fragment`], as openai-harmony encodes each piece separately, and every
//! message is closed by a special token, so an item's tokens never depend on its
//! neighbours. Mapping of items to messages:
//!
//! - prefix: the system message (identity, knowledge cutoff, reasoning effort, channels)
//!   and, when there are instructions or tools, a developer message;
//! - system/developer items: developer messages with `# Instructions`;
//! - reasoning: `analysis`; assistant messages: `final`;
//! - function calls: `to=functions.NAME` on `commentary` with `<|constrain|>json`, ending `<|call|>`;
//! - function call outputs: from `functions.NAME to=assistant` on `commentary`;
//! - a `namespace` tool's functions: their own `## NS` block in `# Tools` (namespaces in
//!   name order, as openai-harmony keeps them in a `BTreeMap`), called as `to=NS.NAME`,
//!   which is also the qualified name the call's item carries.
//!
//! This module must not touch tokenization itself: it only says which fragments and
//! special tokens make up a message.

mod parser;
mod schema;

use std::sync::Arc;

use super::output::MarkupParser;
use super::{ChatFormat, Context, OutputParser};
use crate::item::{Item, Namespace, Prefix, Role, Tool};
use crate::render::Renderer;
use crate::tokenizer::{self, Tokenizer};

pub use parser::HarmonyParser;

/// The harmony special tokens, resolved once from the tokenizer.
#[derive(Debug, Clone, Copy)]
pub struct Specials {
    pub start: u32,
    pub channel: u32,
    pub message: u32,
    pub end: u32,
    pub ret: u32,
    pub call: u32,
    pub constrain: u32,
}

impl Specials {
    fn resolve(t: &dyn Tokenizer) -> Option<Specials> {
        Some(Specials {
            start: t.special("<|start|>")?,
            channel: t.special("<|channel|>")?,
            message: t.special("<|message|>")?,
            end: t.special("<|end|>")?,
            ret: t.special("<|return|>")?,
            call: t.special("<|call|>")?,
            constrain: t.special("<|constrain|>")?,
        })
    }
}

/// openai-harmony's default system message (`SystemContent.new()`).
const MODEL_IDENTITY: &str = "You are ChatGPT, a large language model trained by OpenAI.";
const KNOWLEDGE_CUTOFF: &str = "2024-06";
/// The namespace function tools live in; recipients are `functions.NAME`.
const FUNCTIONS: &str = "functions";

pub struct Harmony {
    tokenizer: Arc<dyn Tokenizer>,
    specials: Specials,
    /// What the engine stops on: end of turn (`<|return|>`) and a tool call (`<|call|>`).
    stop: [u32; 2],
}

impl Default for Harmony {
    fn default() -> Self {
        Harmony::new()
    }
}

impl Harmony {
    pub fn new() -> Harmony {
        let tokenizer = tokenizer::by_name("o200k_harmony").expect("o200k_harmony is embedded in the build");
        let specials =
            Specials::resolve(tokenizer.as_ref()).expect("o200k_harmony has the harmony special tokens");
        Harmony {
            tokenizer,
            specials,
            stop: [specials.ret, specials.call],
        }
    }

    pub fn specials(&self) -> Specials {
        self.specials
    }

    /// `<|start|>{author}{ to=recipient}<|channel|>{channel}{ <|constrain|>json}<|message|>`
    /// with each text piece encoded on its own, as openai-harmony does.
    fn header(
        &self,
        author: &str,
        recipient: Option<&str>,
        channel: Option<&str>,
        json: bool,
        r: &mut Renderer,
    ) {
        r.special(self.specials.start);
        r.fragment(author);
        self.header_rest(recipient, channel, json, r);
    }

    /// The header after the author (the generation header already wrote `assistant`).
    fn header_rest(&self, recipient: Option<&str>, channel: Option<&str>, json: bool, r: &mut Renderer) {
        if let Some(recipient) = recipient {
            r.fragment(&format!(" to={recipient}"));
        }
        if let Some(channel) = channel {
            r.special(self.specials.channel);
            r.fragment(channel);
        }
        if json {
            r.fragment(" ");
            r.special(self.specials.constrain);
            r.fragment("json");
        }
        r.special(self.specials.message);
    }

    fn developer_message(&self, instructions: Option<&str>, tools_section: Option<String>, r: &mut Renderer) {
        let mut sections = Vec::new();
        if let Some(instructions) = instructions {
            sections.push("# Instructions".to_owned());
            sections.push(instructions.to_owned());
        }
        sections.extend(tools_section);
        self.header("developer", None, None, false, r);
        r.fragment(&sections.join("\n\n"));
        r.special(self.specials.end);
    }

    /// An assistant message without its end token: reasoning on `analysis`, a call on
    /// `commentary`, text on `final`. `author` is false for the first message of a
    /// completion, which continues the generation header (`<|start|>assistant`).
    fn assistant_message(&self, author: bool, item: &Item, r: &mut Renderer) {
        if author {
            r.special(self.specials.start);
            r.fragment(Role::Assistant.as_str());
        }
        match item {
            Item::Reasoning { text } => {
                self.header_rest(None, Some("analysis"), false, r);
                r.fragment(text);
            }
            Item::FunctionCall { name, arguments, .. } => {
                self.header_rest(Some(&recipient(name)), Some("commentary"), true, r);
                r.fragment(arguments);
            }
            Item::Message { text, .. } | Item::FunctionCallOutput { output: text, .. } => {
                self.header_rest(None, Some("final"), false, r);
                r.fragment(text);
            }
        }
    }
}

/// `Reasoning: low|medium|high`; efforts outside harmony's three map to the nearest.
fn reasoning_effort(effort: Option<&str>) -> &'static str {
    match effort {
        Some("minimal" | "low" | "none") => "low",
        Some("high" | "xhigh") => "high",
        _ => "medium",
    }
}

/// Who a call goes to: `functions.NAME`, or a namespaced function's qualified name.
fn recipient(name: &str) -> String {
    match Tool::split_name(name) {
        Some(_) => name.to_owned(),
        None => format!("{FUNCTIONS}.{name}"),
    }
}

/// The request's plain function tools: harmony's `functions` namespace.
fn plain_functions(prefix: &Prefix) -> impl Iterator<Item = &Tool> {
    prefix
        .tools
        .iter()
        .filter(|t| Tool::split_name(&t.name).is_none())
}

/// The `# Tools` section of the developer message, as openai-harmony templates its
/// namespaces: `functions` (the plain function tools, when there are any) and each
/// `namespace` tool, in name order.
fn tools_section(prefix: &Prefix) -> String {
    let functions = Namespace {
        name: FUNCTIONS.to_owned(),
        description: None,
    };
    let mut namespaces: Vec<&Namespace> = prefix.namespaces.iter().collect();
    if plain_functions(prefix).next().is_some() {
        namespaces.push(&functions);
    }
    namespaces.sort_by(|a, b| a.name.cmp(&b.name));
    let sections: Vec<String> = namespaces
        .into_iter()
        .map(|ns| {
            let tools: Vec<(&str, &Tool)> = if ns.name == FUNCTIONS {
                plain_functions(prefix).map(|t| (t.name.as_str(), t)).collect()
            } else {
                prefix
                    .tools
                    .iter()
                    .filter_map(|t| match Tool::split_name(&t.name) {
                        Some((space, name)) if space == ns.name => Some((name, t)),
                        _ => None,
                    })
                    .collect()
            };
            namespace_section(ns, &tools)
        })
        .collect();
    format!("# Tools\n\n{}", sections.join("\n\n"))
}

/// One namespace's block; its description is a comment above a non-empty namespace and
/// plain text alone.
fn namespace_section(ns: &Namespace, tools: &[(&str, &Tool)]) -> String {
    let mut lines = vec![format!("## {}\n", ns.name)];
    for line in ns.description.as_deref().unwrap_or_default().lines() {
        lines.push(if tools.is_empty() {
            line.to_owned()
        } else {
            format!("// {line}")
        });
    }
    if tools.is_empty() {
        return lines.join("\n");
    }
    lines.push(format!("namespace {} {{\n", ns.name));
    for (name, tool) in tools {
        for line in tool.description.as_deref().unwrap_or_default().lines() {
            lines.push(format!("// {line}"));
        }
        if tool.parameters.is_null() {
            lines.push(format!("type {name} = () => any;\n"));
        } else {
            lines.push(format!(
                "type {name} = (_: {}) => any;\n",
                schema::typescript(&tool.parameters, "")
            ));
        }
    }
    lines.push(format!("}} // namespace {}", ns.name));
    lines.join("\n")
}

impl ChatFormat for Harmony {
    fn name(&self) -> &str {
        "harmony"
    }

    fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        &self.tokenizer
    }

    fn render_prefix(&self, prefix: &Prefix, r: &mut Renderer) {
        let mut channels =
            "# Valid channels: analysis, commentary, final. Channel must be included for every message."
                .to_owned();
        // openai-harmony says so when the `functions` namespace is there, not for others.
        if plain_functions(prefix).next().is_some() {
            channels.push_str("\nCalls to these tools must go to the commentary channel: 'functions'.");
        }
        let system = [
            format!("{MODEL_IDENTITY}\nKnowledge cutoff: {KNOWLEDGE_CUTOFF}"),
            format!(
                "Reasoning: {}",
                reasoning_effort(prefix.reasoning_effort.as_deref())
            ),
            channels,
        ];
        self.header("system", None, None, false, r);
        r.fragment(&system.join("\n\n"));
        r.special(self.specials.end);

        let has_tools = !prefix.tools.is_empty() || !prefix.namespaces.is_empty();
        if prefix.instructions.is_some() || has_tools {
            let tools = has_tools.then(|| tools_section(prefix));
            self.developer_message(prefix.instructions.as_deref(), tools, r);
        }
    }

    fn render_item(&self, ctx: &Context, item: &Item, r: &mut Renderer) {
        let s = self.specials;
        match item {
            Item::Message {
                role: Role::System | Role::Developer,
                text,
            } => self.developer_message(Some(text), None, r),
            Item::Message {
                role: Role::User,
                text,
            } => {
                self.header("user", None, None, false, r);
                r.fragment(text);
                r.special(s.end);
            }
            Item::Message {
                role: Role::Assistant,
                ..
            }
            | Item::Reasoning { .. } => {
                self.assistant_message(true, item, r);
                r.special(s.end);
            }
            Item::FunctionCall { .. } => {
                self.assistant_message(true, item, r);
                r.special(s.call);
            }
            Item::FunctionCallOutput { call_id, output } => {
                // Validation guarantees the call exists; the fallback keeps rendering total.
                let name = (ctx.call_name)(call_id).unwrap_or_else(|| call_id.clone());
                self.header(&recipient(&name), Some("assistant"), Some("commentary"), false, r);
                r.fragment(output);
                r.special(s.end);
            }
        }
    }

    fn render_generation_header(&self, _ctx: &Context, r: &mut Renderer) {
        r.special(self.specials.start);
        r.fragment(Role::Assistant.as_str());
    }

    fn render_output(&self, sampled: &[u32], r: &mut Renderer) {
        let s = self.specials;
        match sampled.split_last() {
            Some((&last, body)) if last == s.ret => {
                r.ids(body);
                r.special(s.end);
            }
            Some((&last, _)) if last == s.end || last == s.call => r.ids(sampled),
            // Cut off before a stop token: close the message so the next turn starts clean.
            _ => {
                r.ids(sampled);
                r.special(s.end);
            }
        }
    }

    fn stop_tokens(&self) -> &[u32] {
        &self.stop
    }

    fn parser(&self) -> Box<dyn OutputParser> {
        Box::new(MarkupParser::new(HarmonyParser::new(
            self.tokenizer.clone(),
            self.specials,
        )))
    }

    /// Items in order: reasoning on `analysis`, text on `final`, calls on `commentary`.
    /// Each call ends with `<|call|>`, a stop token, so an engine stops after the first.
    /// Text before a call ends with `<|end|>`, a last text with `<|return|>`. Apart from
    /// that stop token this is what `render_item` renders for the same items, so sampled
    /// history equals rendered history.
    fn render_completion(&self, items: &[Item], r: &mut Renderer) {
        let ends_with_call = matches!(items.last(), Some(Item::FunctionCall { .. }));
        for (i, item) in items.iter().enumerate() {
            self.assistant_message(i > 0, item, r);
            let last = i + 1 == items.len();
            r.special(match item {
                Item::FunctionCall { .. } => self.specials.call,
                _ if last && !ends_with_call => self.specials.ret,
                _ => self.specials.end,
            });
        }
        if items.is_empty() {
            self.header_rest(None, Some("final"), false, r);
            r.special(self.specials.ret);
        }
    }
}

#[cfg(test)]
mod tests;
