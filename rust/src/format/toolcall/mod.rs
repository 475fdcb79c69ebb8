//! Streaming tool-call parsers for the open-model families, one token at a time:
//!
//! | parser | reasoning | tool calls |
//! |---|---|---|
//! | `hermes` (Hermes, Qwen2.5, Qwen3) | `<think>…</think>` | `<tool_call>{"name", "arguments"}</tool_call>`, repeated |
//! | `llama3_json` (Llama 3.1-3.3) | — | `<\|python_tag\|>` or a bare `{"name", "parameters"}` object up to the stop token, several joined by `;` |
//! | `mistral` | `[THINK]…[/THINK]` | `[TOOL_CALLS]` then a JSON array (v3) or `name[ARGS]{…}` (tekken, repeated) |
//! | `deepseek_v3` (V3, R1, V3.1) | `<think>…</think>` | `<｜tool▁calls▁begin｜>` blocks of `<｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{…}\n```<｜tool▁call▁end｜>` (or V3.1's `name<｜tool▁sep｜>{…}`) |
//!
//! Markers are read as text, whether the vocabulary has a special token for them or
//! not: each sampled token is decoded (a special token to its literal text) and the
//! text is scanned, holding back only a tail that could still grow into a marker. A
//! call written as a JSON object in the template's shape (`{"name": "...", "arguments":
//! {...}}`: Hermes's, Llama's objects joined by `;`, Mistral v3's array) starts once its
//! name is read and streams its arguments as they are sampled, as the ChatML parser's
//! do; the other forms are emitted when their body is complete (its closing marker, or
//! the stop token for the forms that run to the end). Either way the whole
//! call is checked before it is done, and the events are the ones the ChatML and harmony
//! parsers give; a body that is not a call in the family's shape makes the output
//! `malformed`.
//!
//! A template whose generation prompt opens the reasoning (`<think>\n`, DeepSeek R1 and
//! Qwen3 with thinking on) starts the parser inside reasoning: [`Family::parser`]'s
//! `in_reasoning`.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::call_json::{call_head_with, End, Head, ObjectScan, MAX_CALL_HEAD};
use super::output::{Markup, MarkupParser, OpenKind, OutputItems, SampledText};
use super::{Outcome, OutputParser, ParseEvent};
use crate::error::{Code, Error, Result};
use crate::item::Item;
use crate::tokenizer::Tokenizer;

#[cfg(test)]
mod tests;

/// A model family's output syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Hermes,
    Llama3Json,
    Mistral,
    DeepSeekV3,
}

/// How a call body ends and is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// `{"name": ..., "arguments"|"parameters": ...}` objects; runs to its close marker.
    Objects,
    /// Llama's: objects joined by `;`, up to the stop token.
    LlamaObjects,
    /// Mistral's: a JSON array of objects, or `name[ARGS]{...}` segments.
    Mistral,
    /// DeepSeek's `<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>` calls.
    DeepSeek,
}

struct Syntax {
    reasoning: Option<(&'static str, &'static str)>,
    /// Call openers: marker, the marker that closes the body (None: the stop token), shape.
    calls: &'static [(&'static str, Option<&'static str>, Body)],
    /// A bare JSON object at the start of the output is a call (Llama 3).
    bare_object: Option<Body>,
}

const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";

impl Family {
    /// `--tool-parser NAME`: vLLM's parser names and the family names.
    pub fn by_name(name: &str) -> Result<Family> {
        Ok(match name {
            "hermes" | "qwen" | "qwen2.5" | "qwen3" | "qwen3_xml" => Family::Hermes,
            "llama3_json" | "llama3" | "llama" | "llama4_json" => Family::Llama3Json,
            "mistral" => Family::Mistral,
            "deepseek_v3" | "deepseek_r1" | "deepseek_v31" | "deepseek" => Family::DeepSeekV3,
            _ => {
                return Err(Error::new(
                    Code::InvalidValue,
                    format!("unknown tool parser {name:?}: one of hermes, llama3_json, mistral, deepseek_v3"),
                ))
            }
        })
    }

    /// The family a chat template writes tool calls in, from the markers it renders.
    pub fn detect(template_source: &str) -> Option<Family> {
        if template_source.contains("tool▁call") {
            Some(Family::DeepSeekV3)
        } else if template_source.contains("[TOOL_CALLS]") {
            Some(Family::Mistral)
        } else if template_source.contains("<tool_call>") {
            Some(Family::Hermes)
        } else if template_source.contains("<|python_tag|>") || template_source.contains("<|eom_id|>") {
            Some(Family::Llama3Json)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::Hermes => "hermes",
            Family::Llama3Json => "llama3_json",
            Family::Mistral => "mistral",
            Family::DeepSeekV3 => "deepseek_v3",
        }
    }

    fn syntax(self) -> Syntax {
        match self {
            Family::Hermes => Syntax {
                reasoning: Some(("<think>", "</think>")),
                calls: &[("<tool_call>", Some("</tool_call>"), Body::Objects)],
                bare_object: None,
            },
            Family::Llama3Json => Syntax {
                reasoning: None,
                calls: &[("<|python_tag|>", None, Body::LlamaObjects)],
                bare_object: Some(Body::LlamaObjects),
            },
            Family::Mistral => Syntax {
                reasoning: Some(("[THINK]", "[/THINK]")),
                calls: &[("[TOOL_CALLS]", None, Body::Mistral)],
                bare_object: None,
            },
            Family::DeepSeekV3 => Syntax {
                reasoning: Some(("<think>", "</think>")),
                calls: &[(DS_CALLS_BEGIN, Some(DS_CALLS_END), Body::DeepSeek)],
                bare_object: None,
            },
        }
    }

    /// A streaming parser. `stop` are the ids that end the turn; `in_reasoning` when
    /// the generation prompt already opened the reasoning block.
    /// The text a model of this family samples to produce `items` (reasoning, then
    /// text, then calls), without its stop token: what the simulated engine answers.
    pub fn completion_text(self, items: &[Item]) -> String {
        let mut out = String::new();
        let mut calls = Vec::new();
        for item in items {
            match item {
                Item::Reasoning { text } => {
                    if let Some((open, close)) = self.syntax().reasoning {
                        out.push_str(&format!("{open}\n{text}\n{close}\n\n"));
                    }
                }
                Item::Message { text, .. } => out.push_str(text),
                Item::FunctionCall { name, arguments, .. } => calls.push((name.as_str(), arguments.as_str())),
                Item::FunctionCallOutput { .. } => {}
            }
        }
        let object = |key: &str, (name, arguments): (&str, &str)| {
            format!(
                "{{\"name\": {}, \"{key}\": {arguments}}}",
                serde_json::Value::from(name)
            )
        };
        if calls.is_empty() {
            return out;
        }
        match self {
            Family::Hermes => {
                let calls: Vec<String> = calls
                    .into_iter()
                    .map(|c| format!("<tool_call>\n{}\n</tool_call>", object("arguments", c)))
                    .collect();
                out.push_str(&calls.join("\n"));
            }
            Family::Llama3Json => {
                let calls: Vec<String> = calls.into_iter().map(|c| object("parameters", c)).collect();
                out.push_str("<|python_tag|>");
                out.push_str(&calls.join("; "));
            }
            Family::Mistral => {
                let calls: Vec<String> = calls.into_iter().map(|c| object("arguments", c)).collect();
                out.push_str(&format!("[TOOL_CALLS][{}]", calls.join(", ")));
            }
            Family::DeepSeekV3 => {
                out.push_str(DS_CALLS_BEGIN);
                for (name, arguments) in calls {
                    out.push_str(&format!(
                        "{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n{arguments}\n```{DS_CALL_END}"
                    ));
                }
                out.push_str(DS_CALLS_END);
            }
        }
        out
    }

    pub fn parser(
        self,
        tokenizer: Arc<dyn Tokenizer>,
        stop: Vec<u32>,
        in_reasoning: bool,
    ) -> Box<dyn OutputParser> {
        Box::new(MarkupParser::new(FamilyParser::new(
            self,
            tokenizer,
            stop,
            in_reasoning,
        )))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing read since the start or the last reasoning block or call but whitespace,
    /// which is dropped.
    Start,
    Content,
    Reasoning,
    /// Inside call opener `calls[i]` (or the bare object's body, `usize::MAX`).
    Call(usize),
    Stopped,
}

const BARE: usize = usize::MAX;

/// How far the open call body has been streamed. Hermes's one object, Llama's objects
/// joined by `;` and Mistral's JSON array stream call by call; other forms are read whole.
#[derive(Debug)]
enum Streamed {
    /// Before Mistral's array: its `[`.
    Array,
    /// Before a call object's name (from `FamilyParser::scanned` on).
    Head,
    /// The call started (its name read); its arguments object is being scanned.
    Arguments(ObjectScan),
    /// The arguments went out; the rest of the call object is being scanned.
    Closing(ObjectScan),
    /// After a call object: a separator, then the next call.
    Between,
    /// Nothing more streams: the rest of the body is checked, and emitted, at its end.
    Whole,
}

pub struct FamilyParser {
    family: Family,
    syntax: Syntax,
    tokenizer: Arc<dyn Tokenizer>,
    stop: Vec<u32>,
    state: State,
    items: OutputItems,
    text: SampledText,
    /// Decoded text not yet consumed.
    pending: String,
    /// The body of the open call.
    body: String,
    streamed: Streamed,
    /// How much of `body` the streaming has read.
    scanned: usize,
    /// Calls of the open body started by streaming.
    started: usize,
    /// The last started call's arguments turned out not to be an object: they go out
    /// with the whole-body read.
    unstreamed: bool,
    reasoning_tokens: usize,
}

impl FamilyParser {
    pub fn new(
        family: Family,
        tokenizer: Arc<dyn Tokenizer>,
        stop: Vec<u32>,
        in_reasoning: bool,
    ) -> FamilyParser {
        let syntax = family.syntax();
        // The reasoning item itself starts with its first text.
        let state = if in_reasoning && syntax.reasoning.is_some() {
            State::Reasoning
        } else {
            State::Start
        };
        FamilyParser {
            family,
            syntax,
            tokenizer,
            stop,
            state,
            items: OutputItems::default(),
            text: SampledText::default(),
            pending: String::new(),
            body: String::new(),
            streamed: Streamed::Whole,
            scanned: 0,
            started: 0,
            unstreamed: false,
            reasoning_tokens: 0,
        }
    }

    fn release(&mut self, kind: OpenKind, text: &str, out: &mut Vec<ParseEvent>) {
        if text.is_empty() {
            return;
        }
        if self.items.open_kind() != Some(kind) {
            self.items.start(kind, "", out);
        }
        self.items.push(text, out);
    }

    /// Markers that may start in the current state: (marker, what it opens).
    fn markers(&self) -> Vec<(&'static str, State)> {
        let mut m = Vec::new();
        match self.state {
            State::Reasoning => {
                if let Some((_, close)) = self.syntax.reasoning {
                    m.push((close, State::Content));
                }
            }
            State::Start | State::Content => {
                if let (State::Start, Some((open, _))) = (self.state, self.syntax.reasoning) {
                    m.push((open, State::Reasoning));
                }
                for (i, (open, _, _)) in self.syntax.calls.iter().enumerate() {
                    m.push((open, State::Call(i)));
                }
            }
            _ => {}
        }
        m
    }

    fn advance(&mut self, out: &mut Vec<ParseEvent>) -> std::result::Result<(), String> {
        loop {
            match self.state {
                State::Stopped => return Ok(()),
                State::Call(i) => {
                    let close = if i == BARE { None } else { self.syntax.calls[i].1 };
                    let Some(close) = close else {
                        self.body.push_str(&std::mem::take(&mut self.pending));
                        return self.stream_call(out);
                    };
                    let Some(at) = self.pending.find(close) else {
                        // Keep only what may be the start of the close marker pending.
                        let hold = partial_suffix(&self.pending, &[close]);
                        let done = self.pending.len() - hold;
                        self.body.extend(self.pending.drain(..done));
                        return self.stream_call(out);
                    };
                    self.body.extend(self.pending.drain(..at));
                    self.pending.drain(..close.len());
                    self.stream_call(out)?;
                    self.emit_calls(self.syntax.calls[i].2, out)?;
                    self.state = State::Start;
                }
                State::Start
                    if self.syntax.bare_object.is_some() && self.pending.trim_start().starts_with('{') =>
                {
                    self.pending = self.pending.trim_start().to_owned();
                    self.state = State::Call(BARE);
                    self.open_call(self.syntax.bare_object.expect("checked above"));
                }
                State::Start | State::Content | State::Reasoning => {
                    if self.state == State::Start {
                        self.skip_whitespace();
                    }
                    let markers = self.markers();
                    let found = markers
                        .iter()
                        .filter_map(|&(marker, next)| self.pending.find(marker).map(|at| (at, marker, next)))
                        .min_by_key(|&(at, _, _)| at);
                    let kind = if self.state == State::Reasoning {
                        OpenKind::Reasoning
                    } else {
                        OpenKind::Message
                    };
                    match found {
                        Some((at, marker, next)) => {
                            let mut text = self.pending[..at].to_owned();
                            if matches!(next, State::Call(_)) {
                                // Templates put a newline between the text and the call.
                                if text.ends_with('\n') {
                                    text.pop();
                                }
                                if self.items.open_kind() != Some(OpenKind::Message) && text.trim().is_empty()
                                {
                                    text.clear();
                                }
                            }
                            self.release(kind, &text, out);
                            self.items.close(out);
                            self.pending.drain(..at + marker.len());
                            // After reasoning, text starts afresh (its leading whitespace dropped).
                            self.state = if next == State::Content {
                                State::Start
                            } else {
                                next
                            };
                            if let State::Call(i) = next {
                                self.open_call(self.syntax.calls[i].2);
                            }
                        }
                        None => {
                            // A newline that may turn out to precede a call is held too.
                            let names: Vec<String> = markers
                                .iter()
                                .flat_map(|&(m, next)| {
                                    let lead = matches!(next, State::Call(_)).then(|| format!("\n{m}"));
                                    std::iter::once(m.to_owned()).chain(lead)
                                })
                                .collect();
                            let names: Vec<&str> = names.iter().map(String::as_str).collect();
                            let hold = partial_suffix(&self.pending, &names);
                            if self.state == State::Start && self.pending.len() == hold {
                                return Ok(());
                            }
                            let ready = self.pending.len() - hold;
                            let text: String = self.pending.drain(..ready).collect();
                            if self.state == State::Start && !text.is_empty() {
                                self.state = State::Content;
                            }
                            self.release(kind, &text, out);
                            return Ok(());
                        }
                    }
                }
            }
        }
    }

    fn skip_whitespace(&mut self) {
        let trimmed = self.pending.trim_start().len();
        self.pending.drain(..self.pending.len() - trimmed);
    }

    /// A call body of shape `body` opens.
    fn open_call(&mut self, body: Body) {
        self.streamed = match body {
            Body::Objects | Body::LlamaObjects => Streamed::Head,
            Body::Mistral => Streamed::Array,
            Body::DeepSeek => Streamed::Whole,
        };
        self.scanned = 0;
        self.started = 0;
        self.unstreamed = false;
    }

    /// The body's shape (the open call's).
    fn body_shape(&self) -> Option<Body> {
        match self.state {
            State::Call(BARE) => self.syntax.bare_object,
            State::Call(i) => Some(self.syntax.calls[i].2),
            _ => None,
        }
    }

    /// Stream what the open call body holds so far: once a call object's name is read
    /// the call starts, and its arguments object goes out as it arrives. Anything not in
    /// the expected shape stops the streaming: the rest is read whole by `emit_calls`.
    fn stream_call(&mut self, out: &mut Vec<ParseEvent>) -> std::result::Result<(), String> {
        let Some(shape) = self.body_shape() else {
            return Ok(());
        };
        loop {
            let rest = &self.body[self.scanned..];
            match &mut self.streamed {
                Streamed::Array => match rest.trim_start().strip_prefix('[') {
                    Some(after) => {
                        self.scanned = self.body.len() - after.len();
                        self.streamed = Streamed::Head;
                    }
                    None if rest.trim().is_empty() => return Ok(()),
                    None => self.streamed = Streamed::Whole,
                },
                Streamed::Head => {
                    let keys: &[&str] = if shape == Body::LlamaObjects {
                        &["\"parameters\"", "\"arguments\""]
                    } else {
                        &["\"arguments\""]
                    };
                    match call_head_with(rest, keys) {
                        // A call with no name is refused by the whole-body check.
                        Head::Matched(name, len) if !name.is_empty() => {
                            self.items.start(OpenKind::Call, &name, out);
                            self.started += 1;
                            self.scanned += len;
                            self.streamed = Streamed::Arguments(ObjectScan::default());
                        }
                        Head::Incomplete if rest.len() <= MAX_CALL_HEAD => return Ok(()),
                        _ => self.streamed = Streamed::Whole,
                    }
                }
                Streamed::Arguments(scan) => {
                    let (delta, taken, end) = scan.scan(rest);
                    self.items.push(&delta, out);
                    self.scanned += taken;
                    match end {
                        Some(End::Object) if shape == Body::Objects => self.streamed = Streamed::Whole,
                        Some(End::Object) => self.streamed = Streamed::Closing(ObjectScan::inside()),
                        Some(End::NotObject) => {
                            // Not an object (some models write a JSON string holding
                            // it): it goes out with the whole-body read.
                            self.unstreamed = true;
                            self.streamed = Streamed::Whole;
                        }
                        None => return Ok(()),
                    }
                }
                Streamed::Closing(scan) => {
                    let (_, taken, end) = scan.scan(rest);
                    self.scanned += taken;
                    match end {
                        Some(_) => self.streamed = Streamed::Between,
                        None => return Ok(()),
                    }
                }
                Streamed::Between => {
                    let separator = if shape == Body::LlamaObjects { ';' } else { ',' };
                    match rest.trim_start().strip_prefix(separator) {
                        Some(after) => {
                            self.scanned = self.body.len() - after.len();
                            self.streamed = Streamed::Head;
                        }
                        None if rest.trim().is_empty() => return Ok(()),
                        None => self.streamed = Streamed::Whole,
                    }
                }
                Streamed::Whole => return Ok(()),
            }
        }
    }

    /// Parse the finished body as calls and emit the ones not streamed (the calls
    /// streamed so far are closed once the whole body checks out).
    fn emit_calls(&mut self, body: Body, out: &mut Vec<ParseEvent>) -> std::result::Result<(), String> {
        let text = std::mem::take(&mut self.body);
        self.streamed = Streamed::Whole;
        let started = std::mem::take(&mut self.started);
        let calls = parse_calls(body, &text)?;
        if calls.is_empty() {
            return Err(format!("{} call with no function", self.family.name()));
        }
        if started > calls.len() {
            return Err(format!("{} call body read two ways", self.family.name()));
        }
        if std::mem::take(&mut self.unstreamed) {
            self.items.push(&calls[started - 1].1, out);
        }
        self.items.close(out);
        for (name, arguments) in &calls[started..] {
            self.items.start(OpenKind::Call, name, out);
            self.items.push(arguments, out);
            self.items.close(out);
        }
        Ok(())
    }

    fn stop(&mut self, out: &mut Vec<ParseEvent>) -> std::result::Result<(), String> {
        if !self.text.is_complete() {
            return Err("output ended inside a UTF-8 character".to_owned());
        }
        match self.state {
            State::Call(i) => {
                let (close, body) = if i == BARE {
                    (
                        None,
                        self.syntax.bare_object.expect("a bare call has a body shape"),
                    )
                } else {
                    (self.syntax.calls[i].1, self.syntax.calls[i].2)
                };
                if let Some(close) = close {
                    return Err(format!("unterminated tool call: no {close}"));
                }
                self.body.push_str(&std::mem::take(&mut self.pending));
                self.stream_call(out)?;
                self.emit_calls(body, out)?;
            }
            State::Reasoning => {
                // Reasoning never closed: it is all the model said.
                let text = std::mem::take(&mut self.pending);
                self.release(OpenKind::Reasoning, &text, out);
            }
            State::Start | State::Content => {
                let text = std::mem::take(&mut self.pending);
                if self.state == State::Content || !text.trim().is_empty() {
                    self.release(OpenKind::Message, &text, out);
                }
            }
            State::Stopped => {}
        }
        self.items.close(out);
        self.state = State::Stopped;
        Ok(())
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of one of `markers`.
fn partial_suffix(text: &str, markers: &[&str]) -> usize {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    (1..longest.min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && {
                let tail = &text[text.len() - n..];
                markers.iter().any(|m| m.len() > n && m.starts_with(tail))
            }
        })
        .unwrap_or(0)
}

#[derive(Deserialize)]
struct CallObject<'a> {
    name: Option<String>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow)]
    parameters: Option<&'a RawValue>,
}

/// The arguments as the Responses API carries them: JSON text. Some models write the
/// object as a JSON string holding it.
fn arguments_text(raw: Option<&RawValue>) -> String {
    match raw {
        Some(raw) => match serde_json::from_str::<String>(raw.get()) {
            Ok(inner) => inner,
            Err(_) => raw.get().to_owned(),
        },
        None => "{}".to_owned(),
    }
}

fn call_object(text: &str) -> std::result::Result<(String, String), String> {
    let call: CallObject =
        serde_json::from_str(text.trim()).map_err(|e| format!("tool call is not a JSON object: {e}"))?;
    let name = call
        .name
        .filter(|n| !n.is_empty())
        .ok_or("tool call with no function name")?;
    Ok((name, arguments_text(call.arguments.or(call.parameters))))
}

/// A finished body as `(name, arguments)` calls.
fn parse_calls(body: Body, text: &str) -> std::result::Result<Vec<(String, String)>, String> {
    match body {
        Body::Objects => Ok(vec![call_object(text)?]),
        Body::LlamaObjects => llama_calls(text),
        Body::Mistral => {
            let mut calls = Vec::new();
            for part in text.split("[TOOL_CALLS]").filter(|p| !p.trim().is_empty()) {
                let part = part.trim();
                if part.starts_with('[') {
                    let list: Vec<&RawValue> = serde_json::from_str(part)
                        .map_err(|e| format!("[TOOL_CALLS] is not a JSON array: {e}"))?;
                    for call in list {
                        calls.push(call_object(call.get())?);
                    }
                } else {
                    let (head, arguments) = part
                        .split_once("[ARGS]")
                        .ok_or("[TOOL_CALLS] with neither a JSON array nor [ARGS]")?;
                    // `name[CALL_ID]id[ARGS]` in later tekken versions.
                    let name = head.split("[CALL_ID]").next().unwrap_or(head).trim();
                    if name.is_empty() {
                        return Err("[TOOL_CALLS] with no function name".to_owned());
                    }
                    serde_json::from_str::<&RawValue>(arguments)
                        .map_err(|e| format!("[ARGS] is not JSON: {e}"))?;
                    calls.push((name.to_owned(), arguments.trim().to_owned()));
                }
            }
            Ok(calls)
        }
        Body::DeepSeek => {
            let mut calls = Vec::new();
            let mut rest = text;
            while let Some(at) = rest.find(DS_CALL_BEGIN) {
                let after = &rest[at + DS_CALL_BEGIN.len()..];
                let end = after
                    .find(DS_CALL_END)
                    .ok_or("unterminated <｜tool▁call▁begin｜>")?;
                calls.push(deepseek_call(&after[..end])?);
                rest = &after[end + DS_CALL_END.len()..];
            }
            if !rest.trim().is_empty() {
                return Err(format!(
                    "unexpected text in the tool-call block: {:?}",
                    rest.trim()
                ));
            }
            Ok(calls)
        }
    }
}

/// Llama's calls: JSON objects joined by `;` (a `;` inside an argument's string is
/// part of it: `{"cmd": "cd /tmp; ls"}`).
fn llama_calls(text: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut calls = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<&RawValue>();
        let call = match values.next() {
            Some(Ok(call)) => call,
            Some(Err(e)) => return Err(format!("tool call is not a JSON object: {e}")),
            None => break,
        };
        calls.push(call_object(call.get())?);
        rest = rest[values.byte_offset()..].trim_start();
        match rest.strip_prefix(';') {
            Some(after) => rest = after.trim_start(),
            None if rest.is_empty() => {}
            None => return Err(format!("unexpected text after a tool call: {rest:?}")),
        }
    }
    Ok(calls)
}

/// `function<｜tool▁sep｜>name\n```json\n{...}\n```` (V3, R1) or `name<｜tool▁sep｜>{...}` (V3.1).
fn deepseek_call(call: &str) -> std::result::Result<(String, String), String> {
    let (left, right) = call
        .split_once(DS_SEP)
        .ok_or("tool call with no <｜tool▁sep｜>")?;
    let (name, arguments) = match right.split_once('\n') {
        Some((name, fenced)) if fenced.trim_start().starts_with("```") => {
            let inner = fenced
                .trim()
                .trim_start_matches("```json")
                .trim_start_matches("```");
            let inner = inner
                .strip_suffix("```")
                .ok_or("tool call arguments with no closing ```")?;
            (name.trim(), inner.trim())
        }
        _ => (left.trim(), right.trim()),
    };
    if name.is_empty() {
        return Err("tool call with no function name".to_owned());
    }
    serde_json::from_str::<&RawValue>(arguments)
        .map_err(|e| format!("tool call arguments are not JSON: {e}"))?;
    Ok((
        name.to_owned(),
        arguments_text(serde_json::from_str(arguments).ok()),
    ))
}

impl Markup for FamilyParser {
    fn read(&mut self, id: u32, out: &mut Vec<ParseEvent>) -> std::result::Result<(), String> {
        if id as usize >= self.tokenizer.vocab_size() {
            return Err(format!("token id {id} is outside the vocabulary"));
        }
        if self.state == State::Stopped {
            let name = String::from_utf8_lossy(self.tokenizer.token_bytes(id)).into_owned();
            return Err(format!("token {name:?} after the stop token"));
        }
        if self.state == State::Reasoning {
            self.reasoning_tokens += 1;
        }
        if self.stop.contains(&id) {
            return self.stop(out);
        }
        self.text.push(self.tokenizer.as_ref(), id, &mut self.pending)?;
        self.advance(out)
    }

    fn end(&mut self, out: &mut Vec<ParseEvent>) -> Outcome {
        if self.state == State::Stopped {
            return Outcome::Stopped;
        }
        // Cut off: keep the text so far; a call cut off after its name is closed with the
        // arguments streamed so far (as the ChatML parser does), any other is dropped.
        match self.state {
            State::Start | State::Content => {
                let text = std::mem::take(&mut self.pending);
                if self.state == State::Content || !text.trim().is_empty() {
                    self.release(OpenKind::Message, &text, out);
                }
            }
            State::Reasoning => {
                let text = std::mem::take(&mut self.pending);
                self.release(OpenKind::Reasoning, &text, out);
            }
            _ => {}
        }
        self.text.clear();
        self.items.close(out);
        self.pending.clear();
        self.body.clear();
        self.streamed = Streamed::Whole;
        self.started = 0;
        self.unstreamed = false;
        self.state = State::Content;
        Outcome::Truncated
    }

    fn items(&self) -> &[Item] {
        self.items.items()
    }

    fn stopped(&self) -> bool {
        self.state == State::Stopped
    }

    fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }
}
