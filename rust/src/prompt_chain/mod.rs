//! The prompt chain: the rendered tokens of one response chain, a [`Conversation`] (the
//! chain's items as the model reads them; not the server's `/v1/conversations` resource,
//! which lives in Python's `store/conversations.py` and `transport/conversations.py`).
//!
//! A conversation holds a [`PromptBuilder`], which turns its items into prompt tokens
//! incrementally: segment by segment through a chat format for harmony and ChatML
//! ([`SegmentBuilder`]), or by rendering a model's chat template and tokenizing the
//! difference ([`TemplateBuilder`]). Everything else is done once, the same way for
//! both: the function calls still waiting for their output, the context budget, which
//! turn is open and which parser may commit to it, the [`Checkpoint`]s (one per response
//! id) that forks continue from, and their memory accounting. A checkpoint, a fork and a
//! [`Prompt`] share the history (persistent chunks, `crate::chunks`) instead of
//! copying it.
//!
//! This module owns the conversation and its accounting; it does not parse requests
//! (that is `validate`) and knows chat formats only through its builders.

mod builder;
mod prompt;
pub mod segments;
pub mod template;
mod turn;

use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::value::RawValue;

use crate::error::{Code, Error, Result};
use crate::item::{Item, Prefix};
use crate::validate::{self, check_context_budget, CreateRequest, Limits, Policy};

pub use builder::{Appended, PromptBuilder};
pub use prompt::Prompt;
pub use segments::SegmentBuilder;
pub use template::TemplateBuilder;
use turn::TurnId;
pub use turn::{Turn, TurnParser};

/// The new part of a request, already parsed and checked for schema.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    pub prefix: Prefix,
    pub items: Vec<Item>,
    pub max_output_tokens: Option<usize>,
}

/// A function call still waiting for its output. A conversation keeps only these (a
/// handful, answered calls leave), behind an `Arc` that checkpoints and forks share, so a
/// turn copies O(open calls), never O(history).
#[derive(Clone)]
pub struct OpenCall {
    pub(crate) call_id: String,
    pub(crate) name: String,
}

/// What a checkpoint freezes. Cloning it is O(1) in the history: everything is shared.
#[derive(Clone)]
struct State {
    builder: Box<dyn PromptBuilder>,
    calls: Arc<Vec<OpenCall>>,
}

impl State {
    /// The bytes this state holds that `base` (an earlier state) does not.
    fn unique_bytes(&self, base: Option<&State>) -> usize {
        self.builder.unique_bytes(base.map(|b| b.builder.as_ref())) + self.call_bytes(base)
    }

    /// The open calls' bytes, none when `base` shares them.
    fn call_bytes(&self, base: Option<&State>) -> usize {
        match base {
            Some(b) if Arc::ptr_eq(&b.calls, &self.calls) => 0,
            _ => self
                .calls
                .iter()
                .map(|c| size_of::<OpenCall>() + c.call_id.len() + c.name.len())
                .sum(),
        }
    }
}

/// The rendered-token cache of one response chain.
pub struct Conversation {
    context_window: usize,
    state: State,
    /// The state of the last checkpoint (or of the checkpoint this fork continues).
    base: Option<State>,
    id: u64,
    turns: u64,
}

/// An immutable position in a conversation (one per response id).
#[derive(Clone)]
pub struct Checkpoint {
    context_window: usize,
    state: State,
    memory_bytes: usize,
}

impl Checkpoint {
    pub fn token_count(&self) -> usize {
        self.state.builder.len()
    }

    /// Bytes this checkpoint holds that the checkpoint before it in its chain does not.
    pub fn memory_bytes(&self) -> usize {
        self.memory_bytes
    }

    pub fn prompt(&self) -> Prompt {
        self.state.builder.prompt()
    }

    /// A conversation continuing from here; shares the history, copies nothing. Its
    /// stats start at zero.
    pub fn fork(&self) -> Conversation {
        let mut state = self.state.clone();
        state.builder.reset_stats();
        Conversation {
            context_window: self.context_window,
            base: Some(self.state.clone()),
            state,
            id: next_conversation_id(),
            turns: 0,
        }
    }
}

impl Conversation {
    /// An empty conversation built by `builder` (a [`SegmentBuilder`] or a
    /// [`TemplateBuilder`]).
    pub fn new(builder: impl PromptBuilder, context_window: usize) -> Self {
        Conversation {
            context_window,
            state: State {
                builder: Box::new(builder),
                calls: Arc::new(Vec::new()),
            },
            base: None,
            id: next_conversation_id(),
            turns: 0,
        }
    }

    /// The prefix the prompt is rendered with.
    pub fn prefix(&self) -> &Prefix {
        self.state.builder.prefix()
    }

    /// Apply the delta's prefix, check its items against this conversation (open calls,
    /// context budget), render and tokenize only them, and open the assistant turn. On
    /// error the conversation is unchanged.
    pub fn extend(&mut self, delta: Delta) -> Result<Turn> {
        let max_output = delta.max_output_tokens.unwrap_or(0);
        self.apply(Some(delta.prefix), &delta.items, true, Some(max_output))
    }

    /// `extend` for a parsed request: refuses a request whose parse failed, checks the
    /// content policy on new text only (instructions only when they changed), then
    /// appends its items and opens the turn.
    pub fn extend_request(&mut self, request: &CreateRequest, policy: Option<&Policy>) -> Result<Turn> {
        check_request(request, self.prefix(), policy)?;
        // Requests resend their instructions and tools every turn: copy them only when
        // they differ from the conversation's.
        let prefix = (request.prefix != *self.prefix()).then(|| request.prefix.clone());
        let max_output = request.max_output_tokens.map_or(0, |n| n as usize);
        self.apply(prefix, &request.input.items, true, Some(max_output))
    }

    /// `append_items` from JSON: `items_json` is an `input` array (or string),
    /// `tools_json` a `tools` array, both parsed and checked by `validate` as in a request.
    /// `instructions` or `tools_json` None keeps the current one.
    pub fn append_json(
        &mut self,
        items_json: &str,
        instructions: Option<String>,
        tools_json: Option<&str>,
    ) -> Result<Turn> {
        let (items, prefix) = parse_append(self.prefix(), items_json, instructions, tools_json)?;
        self.append_items(items, prefix)
    }

    /// Append items without opening a turn (token caches, rebuilds from a store). `prefix`
    /// None keeps the current one. On error the conversation is unchanged.
    pub fn append_items(&mut self, items: Vec<Item>, prefix: Option<Prefix>) -> Result<Turn> {
        self.apply(prefix, &items, false, None)
    }

    fn apply(
        &mut self,
        prefix: Option<Prefix>,
        items: &[Item],
        open_turn: bool,
        max_output: Option<usize>,
    ) -> Result<Turn> {
        let mut next = self.state.clone();
        let mut open = next.calls.as_ref().clone();
        admit_calls(&mut open, items)?;
        let prefix = prefix.filter(|p| p != next.builder.prefix());
        let appended = next.builder.append(prefix, items, open_turn, &next.calls)?;
        let prompt_tokens = next.builder.len();
        if let Some(max_output) = max_output {
            check_context_budget(
                appended.kept,
                prompt_tokens - appended.kept,
                max_output,
                self.context_window,
            )?;
        }
        next.calls = Arc::new(open);
        self.state = next;
        if open_turn {
            self.turns += 1;
        }
        Ok(Turn {
            prompt_tokens,
            cached_tokens: appended.kept,
            new_tokens: prompt_tokens - appended.kept,
            invalidated: appended.invalidated,
        })
    }

    /// Grow the last item's text by `chunk` (a message or tool output arriving in
    /// chunks); returns how many tokens at the end of the prompt changed.
    pub fn append_text(&mut self, chunk: &str) -> Result<usize> {
        if chunk.is_empty() {
            return Ok(0);
        }
        let mut next = self.state.clone();
        let changed = next.builder.grow_last(chunk, &next.calls)?;
        self.state = next;
        Ok(changed)
    }

    /// Tokens so far, including the assistant header when a turn is open.
    pub fn prompt(&self) -> Prompt {
        self.state.builder.prompt()
    }

    /// The prompt an engine is given to answer now: the conversation and the assistant
    /// turn's header (the generation prompt), whether or not a turn is open. The
    /// conversation is unchanged (the header is added on a shared copy).
    pub fn engine_prompt(&self) -> Result<Prompt> {
        if self.state.builder.turn_open() {
            return Ok(self.prompt());
        }
        self.state.builder.generation_prompt(&self.state.calls)
    }

    fn open_turn_id(&self) -> Result<TurnId> {
        TurnId::open(self.state.builder.turn_open(), self.id, self.turns)
    }

    /// A parser for the open turn's output.
    pub fn parser(&self) -> Result<TurnParser> {
        Ok(TurnParser::new(self.state.builder.parser(), self.open_turn_id()?))
    }

    /// Record the model's turn as the parser saw it (its function calls become open
    /// calls). Closes the turn.
    pub fn commit_output(&mut self, parser: &TurnParser) -> Result<()> {
        if self.open_turn_id()? != parser.turn {
            return Err(Error::new(
                Code::InvalidValue,
                "this parser belongs to another turn or conversation",
            ));
        }
        self.record_output(parser.items(), parser.sampled(), false)
    }

    /// Append a stored model turn (rebuilds from a store): the generation header, then
    /// `ids` with `items_json` (the response's `output` array) as its items, so its
    /// function calls become open calls with their original call ids. Under a segment
    /// builder nothing is re-tokenized: the rebuilt prompt is the one the original
    /// conversation held. On error the conversation is unchanged.
    pub fn append_output_json(&mut self, items_json: &str, ids: &[u32]) -> Result<()> {
        self.output_json(items_json, ids, true)?;
        self.turns += 1;
        Ok(())
    }

    /// Close the open turn with `ids` as its output and `items_json` (output items) as its
    /// items, as `commit_output` does with a parser's: for output that keeps items the
    /// client already saw (an interrupted response's completed items, whose function calls
    /// keep their call ids). On error the conversation is unchanged.
    pub fn commit_items_json(&mut self, items_json: &str, ids: &[u32]) -> Result<()> {
        self.open_turn_id()?;
        self.output_json(items_json, ids, false)
    }

    fn output_json(&mut self, items_json: &str, ids: &[u32], open_first: bool) -> Result<()> {
        let vocab = self.state.builder.tokenizer().vocab_size();
        let items = parse_stored_output(items_json, ids, vocab)?;
        self.record_output(&items, ids, open_first)
    }

    fn record_output(&mut self, items: &[Item], sampled: &[u32], open_first: bool) -> Result<()> {
        let mut next = self.state.clone();
        let mut open = next.calls.as_ref().clone();
        admit_calls(&mut open, items)?;
        next.builder
            .append_output(items, sampled, open_first, &next.calls)?;
        next.calls = Arc::new(open);
        self.state = next;
        Ok(())
    }

    /// Freeze the current position (one per response id).
    pub fn checkpoint(&mut self) -> Checkpoint {
        let memory_bytes = self.state.unique_bytes(self.base.as_ref());
        self.base = Some(self.state.clone());
        Checkpoint {
            context_window: self.context_window,
            state: self.state.clone(),
            memory_bytes,
        }
    }

    pub fn token_count(&self) -> usize {
        self.state.builder.len()
    }

    /// Everything this conversation holds (shared or not).
    pub fn memory_bytes(&self) -> usize {
        size_of::<Conversation>() + self.state.builder.memory_bytes() + self.state.call_bytes(None)
    }

    /// Call ids of function calls that have no output yet, oldest first.
    pub fn open_call_ids(&self) -> Vec<String> {
        self.state.calls.iter().map(|c| c.call_id.clone()).collect()
    }

    /// The builder's work counters by name.
    pub fn stats(&self) -> Vec<(&'static str, u64)> {
        self.state.builder.stats()
    }
}

/// Check the delta's calls against the conversation (protocol.md section 4): a
/// `function_call_output` must answer an open call, a `function_call` must not reuse the id
/// of an open one. Updates the open set; O(new items + open calls), never O(history).
fn admit_calls(open: &mut Vec<OpenCall>, items: &[Item]) -> Result<()> {
    let error = |message: String| Err(Error::new(Code::UnknownCallId, message).at("input"));
    for (i, item) in items.iter().enumerate() {
        match item {
            Item::FunctionCall { call_id, name, .. } => {
                if open.iter().any(|c| &c.call_id == call_id) {
                    return error(format!(
                        "input[{i}] is a function_call with call_id {call_id:?}, but a call with this \
                         call_id is already waiting for its output"
                    ));
                }
                open.push(OpenCall {
                    call_id: call_id.clone(),
                    name: name.clone(),
                });
            }
            Item::FunctionCallOutput { call_id, .. } => {
                let Some(at) = open.iter().position(|c| &c.call_id == call_id) else {
                    return error(format!(
                        "input[{i}] is a function_call_output for call_id {call_id:?}, which is not \
                         an open function_call of this conversation"
                    ));
                };
                open.remove(at);
            }
            _ => {}
        }
    }
    Ok(())
}

/// A request refused before rendering: its parse failed, or the content policy refuses
/// its new text (its instructions only when they differ from `current`'s).
fn check_request(request: &CreateRequest, current: &Prefix, policy: Option<&Policy>) -> Result<()> {
    if let Some(error) = &request.error {
        return Err(error.clone());
    }
    if let Some(policy) = policy {
        if let Some(instructions) = &request.prefix.instructions {
            if current.instructions.as_ref() != Some(instructions) {
                policy.check_text(instructions, "instructions")?;
            }
        }
        policy.check_input(&request.input)?;
    }
    Ok(())
}

/// `append_items` from JSON: `items_json` is an `input` array (or string), `tools_json` a
/// `tools` array, both parsed and checked by `validate` as in a request. Returns the items
/// and the new prefix (None when `instructions` and `tools_json` are both None: keep
/// `current`; otherwise `current` with what was given replaced).
fn parse_append(
    current: &Prefix,
    items_json: &str,
    instructions: Option<String>,
    tools_json: Option<&str>,
) -> Result<(Vec<Item>, Option<Prefix>)> {
    let not_json = |what: &str| Error::new(Code::InvalidJson, format!("{what} is not one JSON value"));
    serde_json::from_str::<&RawValue>(items_json).map_err(|_| not_json("items_json"))?;
    let mut body = String::with_capacity(items_json.len() + tools_json.map_or(0, str::len) + 64);
    body.push_str("{\"input\":");
    body.push_str(items_json);
    if let Some(tools) = tools_json {
        serde_json::from_str::<&RawValue>(tools).map_err(|_| not_json("tools_json"))?;
        body.push_str(",\"tools\":");
        body.push_str(tools);
    }
    if let Some(text) = &instructions {
        body.push_str(",\"instructions\":");
        body.push_str(&serde_json::Value::from(text.as_str()).to_string());
    }
    body.push('}');
    let request = validate::parse_request(body.as_bytes(), &Limits::default())?;
    if let Some(error) = request.error {
        return Err(error);
    }
    let prefix = (instructions.is_some() || tools_json.is_some()).then(|| Prefix {
        instructions: if instructions.is_some() {
            request.prefix.instructions
        } else {
            current.instructions.clone()
        },
        tools: if tools_json.is_some() {
            request.prefix.tools
        } else {
            current.tools.clone()
        },
        namespaces: if tools_json.is_some() {
            request.prefix.namespaces
        } else {
            current.namespaces.clone()
        },
        reasoning_effort: current.reasoning_effort.clone(),
    });
    Ok((request.input.items, prefix))
}

/// A stored model turn's items (`items_json`, the response's `output` array), checked
/// with its output ids against a vocabulary of `vocab` tokens.
fn parse_stored_output(items_json: &str, ids: &[u32], vocab: usize) -> Result<Vec<Item>> {
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::new(
            Code::InvalidValue,
            format!("output token id {bad} is outside the vocabulary ({vocab} tokens)"),
        ));
    }
    serde_json::from_str::<&RawValue>(items_json)
        .map_err(|_| Error::new(Code::InvalidJson, "items_json is not one JSON value"))?;
    let body = format!("{{\"input\":{items_json}}}");
    let request = validate::parse_request(body.as_bytes(), &Limits::default())?;
    if let Some(error) = request.error {
        return Err(error);
    }
    Ok(request.input.items)
}

/// A fresh conversation id (turn parsers name the conversation they belong to).
fn next_conversation_id() -> u64 {
    CONVERSATION_IDS.fetch_add(1, Ordering::Relaxed)
}

static CONVERSATION_IDS: AtomicU64 = AtomicU64::new(1);
