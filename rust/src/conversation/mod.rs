//! The rendered-token cache: one [`Conversation`] per response chain.
//!
//! A chain is a sequence of segments (see `segment`): the prefix (instructions, tools),
//! one per input item, and per turn the assistant header and the sampled output, kept as
//! the sampled ids verbatim. Its tokens and segments live in persistent chunked vectors
//! (`chunks`), so a [`Checkpoint`] (one per response id), a fork from it and a [`Prompt`]
//! share the history instead of copying it.
//!
//! Appending renders and tokenizes only the new segments. Anything that rewrites history
//! is explicit and counted in [`Stats`]: a changed prefix re-renders from the prefix on; an
//! abandoned turn drops its header; a growing text re-tokenizes from just before its join
//! (`growth`). A text run left open by the last segment (ChatML's `\n` after `<|im_end|>`)
//! is kept as text and encoded provisionally at the end of the prompt, so that the next
//! append continues it exactly as a full render would.
//!
//! This module owns the chain and its accounting; it does not parse requests (that is
//! `validate`) and does not know any chat format beyond the `ChatFormat` trait.

pub(crate) mod chunks;
mod growth;
mod prompt;
mod segment;
mod turn;

use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chunks::Chunks;
use growth::{Change, Continuation, Position, Recorder, Recording};
use segment::{Body, PrefixEntry, Rendering, Segment, Step};
use serde_json::value::RawValue;

use crate::error::{Code, Error, Result};
use crate::format::{ChatFormat, Context};
use crate::item::{Item, Prefix};
use crate::render::Renderer;
use crate::tokenizer::Tokenizer;
use crate::validate::{self, check_context_budget, CreateRequest, Limits, Policy};

pub use prompt::Prompt;
pub(crate) use turn::TurnId;
pub use turn::{Turn, TurnParser};

/// Work counters of one conversation (forks start from zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub segments_rendered: u64,
    pub tokens_rendered: u64,
    /// Tokens kept from the cache by appends instead of being rendered again.
    pub tokens_reused: u64,
    /// History rewrites forced by a changed prefix.
    pub invalidations: u64,
    /// Growing texts whose re-tokenization failed its check and re-encoded the segment.
    pub text_fallbacks: u64,
}

impl Stats {
    pub fn pairs(&self) -> [(&'static str, u64); 5] {
        [
            ("segments_rendered", self.segments_rendered),
            ("tokens_rendered", self.tokens_rendered),
            ("tokens_reused", self.tokens_reused),
            ("invalidations", self.invalidations),
            ("text_fallbacks", self.text_fallbacks),
        ]
    }
}

/// The new part of a request, already parsed and checked for schema.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    pub prefix: Prefix,
    pub items: Vec<Item>,
    pub max_output_tokens: Option<usize>,
}

/// A function call still waiting for its output. The chain keeps only these (a handful,
/// answered calls leave), behind an `Arc` that checkpoints and forks share, so a turn
/// copies O(open calls), never O(history); a tool result naming an older call finds its
/// function by walking the segments back (only when re-rendering history).
#[derive(Clone)]
pub(crate) struct OpenCall {
    pub(crate) call_id: String,
    pub(crate) name: String,
}

/// Where the last growing text may restart re-tokenization (see `growth`).
#[derive(Clone, Copy, PartialEq)]
struct GrowthHint {
    segment: usize,
    /// Which encoded text of the segment's rendering; None for the open run.
    text: Option<usize>,
    byte: usize,
}

/// How `append_text`'s fast path went.
#[derive(PartialEq)]
enum Regrowth {
    /// Re-tokenized in place; this many tokens were kept.
    Done(usize),
    /// The grown item renders to a different structure (e.g. an empty text now encoded).
    Restructured,
    /// The re-encoded ids disagreed with the cached ones.
    CheckFailed,
}

/// Tokens rendered and kept by one rewrite.
struct Work {
    kept: usize,
    segments: usize,
    tokens: usize,
}

/// The state a checkpoint freezes. Cloning it is O(1): everything is shared.
#[derive(Clone)]
struct Chain {
    tokens: Chunks<u32>,
    segments: Chunks<Segment>,
    /// The run left open by the last segment; its ids are the last `run_tokens` tokens.
    run: Arc<str>,
    run_tokens: usize,
    open_calls: Arc<Vec<OpenCall>>,
    hint: Option<GrowthHint>,
    /// Everything the chain holds (`unique_bytes(None)`), kept up to date by
    /// `Conversation::replace_chain` in O(changed nodes).
    bytes: usize,
}

impl Chain {
    /// An empty chain: nothing is rendered, not even the prefix, until the first append
    /// (so that the first turn's tokens all count as new, none as cached).
    fn new() -> Chain {
        Chain {
            tokens: Chunks::default(),
            segments: Chunks::default(),
            run: Arc::from(""),
            run_tokens: 0,
            open_calls: Arc::new(Vec::new()),
            hint: None,
            bytes: 0,
        }
    }

    /// Tokens that are final (the provisional encoding of the open run excluded).
    fn final_len(&self) -> usize {
        self.tokens.len() - self.run_tokens
    }

    fn segment(&self, index: usize) -> &Segment {
        self.segments.get(index).expect("segment index in range")
    }

    fn prefix(&self) -> &Prefix {
        match self.segments.get(0).map(|s| &s.body) {
            Some(Body::Prefix(entry)) => &entry.prefix,
            Some(_) => unreachable!("a chain starts with its prefix"),
            None => &NO_PREFIX,
        }
    }

    fn turn_open(&self) -> bool {
        matches!(self.segments.last().map(|s| &s.body), Some(Body::Header))
    }

    /// Where the items end: before the open turn's header, if any.
    fn history_len(&self) -> usize {
        self.segments.len() - usize::from(self.turn_open())
    }

    /// Name of the function an earlier call of this chain called.
    fn call_name(&self, call_id: &str) -> Option<String> {
        if let Some(open) = self.open_calls.iter().find(|c| c.call_id == call_id) {
            return Some(open.name.clone());
        }
        let named = |item: &Item| match item {
            Item::FunctionCall {
                call_id: id, name, ..
            } if id == call_id => Some(name.clone()),
            _ => None,
        };
        (0..self.segments.len())
            .rev()
            .find_map(|i| match &self.segment(i).body {
                Body::Item(item) => named(item),
                Body::Output(items) => items.iter().rev().find_map(named),
                _ => None,
            })
    }

    /// Segments `from..to` as steps that render them again (output ids copied verbatim).
    fn replay(&self, from: usize, to: usize) -> Vec<Step> {
        (from..to)
            .map(|i| {
                let seg = self.segment(i);
                match &seg.body {
                    Body::Prefix(entry) => Step::Prefix(Arc::clone(entry)),
                    Body::Item(item) => Step::Item(Arc::clone(item)),
                    Body::Header => Step::Header,
                    Body::Output(items) => {
                        let (end, run_after) = if i + 1 < self.segments.len() {
                            let next = self.segment(i + 1);
                            (next.start, next.carried.clone())
                        } else {
                            (
                                self.final_len(),
                                (!self.run.is_empty()).then(|| Arc::clone(&self.run)),
                            )
                        };
                        Step::Replay {
                            items: Arc::clone(items),
                            ids: self.tokens.to_vec(seg.start, end),
                            run_after,
                        }
                    }
                }
            })
            .collect()
    }

    /// Drop segments `from..` and render `steps` in their place.
    fn rewrite(&mut self, format: &dyn ChatFormat, from: usize, steps: Vec<Step>) -> Work {
        let (start, carried) = if from < self.segments.len() {
            let seg = self.segment(from);
            (seg.start, seg.carried.clone())
        } else {
            (self.final_len(), Some(Arc::clone(&self.run)))
        };
        let prev = from.checked_sub(1).and_then(|i| self.segment(i).kind());
        let before = self.clone();
        let earlier = |id: &str| before.call_name(id);
        let carried = carried.as_deref().unwrap_or("");
        // Appending after an open run continues it: its cached ids spare re-encoding it whole.
        let continuation = (from == self.segments.len() && self.run_tokens > 0).then(|| {
            Continuation::new(
                format.tokenizer().as_ref(),
                carried,
                self.tokens.to_vec(start, self.tokens.len()),
            )
        });
        let tokenizer: &dyn Tokenizer = match &continuation {
            Some(c) => c,
            None => format.tokenizer().as_ref(),
        };
        let mut rendering = Rendering::new(format, tokenizer, start, carried, prev, &earlier);
        self.tokens.truncate(start);
        self.segments.truncate(from);
        let count = steps.len();
        for step in steps {
            let segment = rendering.render(step);
            self.segments.push(segment);
        }
        let (ids, run) = rendering.renderer.into_parts();
        self.tokens.extend_from_slice(&ids);
        let mut provisional = Vec::new();
        tokenizer.encode(&run, &mut provisional);
        self.tokens.extend_from_slice(&provisional);
        self.run = Arc::from(run);
        self.run_tokens = provisional.len();
        self.hint = None;
        let reused = continuation.as_ref().map_or(0, Continuation::reused);
        Work {
            kept: start + reused,
            segments: count,
            tokens: ids.len() + provisional.len() - reused,
        }
    }

    fn unique_bytes(&self, base: Option<&Chain>) -> usize {
        let run = match base {
            Some(b) if Arc::ptr_eq(&b.run, &self.run) => 0,
            _ => self.run.len(),
        };
        let calls = match base {
            Some(b) if Arc::ptr_eq(&b.open_calls, &self.open_calls) => 0,
            _ => self
                .open_calls
                .iter()
                .map(|c| size_of::<OpenCall>() + c.call_id.len() + c.name.len())
                .sum(),
        };
        self.tokens.unique_bytes(base.map(|b| &b.tokens))
            + self.segments.unique_bytes(base.map(|b| &b.segments))
            + run
            + calls
    }
}

/// Check the delta's calls against the chain (protocol.md section 4): a
/// `function_call_output` must answer an open call, a `function_call` must not reuse the id
/// of an open one. Updates the open set; O(new items + open calls), never O(history).
pub(crate) fn admit_calls(open: &mut Vec<OpenCall>, items: &[Item]) -> Result<()> {
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

/// `item` with `chunk` appended to its growing text (message or reasoning text, tool
/// output, call arguments).
fn grown(item: &Item, chunk: &str) -> Item {
    let mut item = item.clone();
    match &mut item {
        Item::Message { text, .. } | Item::Reasoning { text } => text.push_str(chunk),
        Item::FunctionCallOutput { output, .. } => output.push_str(chunk),
        Item::FunctionCall { arguments, .. } => arguments.push_str(chunk),
    }
    item
}

/// A request refused before rendering: its parse failed, or the content policy refuses
/// its new text (its instructions only when they differ from `current`'s).
pub(crate) fn check_request(
    request: &CreateRequest,
    current: &Prefix,
    policy: Option<&Policy>,
) -> Result<()> {
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
pub(crate) fn parse_append(
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
pub(crate) fn parse_stored_output(items_json: &str, ids: &[u32], vocab: usize) -> Result<Vec<Item>> {
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
pub(crate) fn next_conversation_id() -> u64 {
    CONVERSATION_IDS.fetch_add(1, Ordering::Relaxed)
}

static CONVERSATION_IDS: AtomicU64 = AtomicU64::new(1);

/// The prefix of a chain that has rendered nothing yet.
static NO_PREFIX: Prefix = Prefix {
    instructions: None,
    tools: Vec::new(),
    namespaces: Vec::new(),
    reasoning_effort: None,
};

/// The rendered-token cache of one response chain.
pub struct Conversation {
    format: Arc<dyn ChatFormat>,
    context_window: usize,
    chain: Chain,
    /// The chain of the last checkpoint (or of the checkpoint this fork continues).
    base: Option<Chain>,
    stats: Stats,
    id: u64,
    turns: u64,
}

/// An immutable position in a chain (one per response id).
#[derive(Clone)]
pub struct Checkpoint {
    format: Arc<dyn ChatFormat>,
    context_window: usize,
    chain: Chain,
    memory_bytes: usize,
}

impl Checkpoint {
    pub fn token_count(&self) -> usize {
        self.chain.tokens.len()
    }

    /// Bytes this checkpoint holds that the checkpoint before it in its chain does not.
    pub fn memory_bytes(&self) -> usize {
        self.memory_bytes
    }

    pub fn prompt(&self) -> Prompt {
        Prompt {
            tokens: self.chain.tokens.clone(),
        }
    }

    /// A conversation continuing from here; shares the history, copies nothing.
    pub fn fork(&self) -> Conversation {
        Conversation {
            format: Arc::clone(&self.format),
            context_window: self.context_window,
            chain: self.chain.clone(),
            base: Some(self.chain.clone()),
            stats: Stats::default(),
            id: next_conversation_id(),
            turns: 0,
        }
    }
}

impl Conversation {
    pub fn new(format: Arc<dyn ChatFormat>, context_window: usize) -> Self {
        let chain = Chain::new();
        Conversation {
            format,
            context_window,
            chain,
            base: None,
            stats: Stats::default(),
            id: next_conversation_id(),
            turns: 0,
        }
    }

    /// The prefix the chain is rendered with.
    pub fn prefix(&self) -> &Prefix {
        self.chain.prefix()
    }

    /// Apply the delta's prefix, check its items against this chain (open calls, context
    /// budget), render and tokenize only them, and open the assistant turn. On error the
    /// conversation is unchanged.
    pub fn extend(&mut self, delta: Delta) -> Result<Turn> {
        let max_output = delta.max_output_tokens.unwrap_or(0);
        self.apply(Some(delta.prefix), delta.items, true, Some(max_output))
    }

    /// `extend` for a parsed request: refuses a request whose parse failed, checks the
    /// content policy on new text only (instructions only when they changed), then
    /// appends its items and opens the turn.
    pub fn extend_request(&mut self, request: &CreateRequest, policy: Option<&Policy>) -> Result<Turn> {
        check_request(request, self.prefix(), policy)?;
        // Requests resend their instructions and tools every turn: copy them only when
        // they differ from the chain's.
        let prefix = (self.chain.history_len() == 0 || request.prefix != *self.prefix())
            .then(|| request.prefix.clone());
        let max_output = request.max_output_tokens.map_or(0, |n| n as usize);
        self.apply(prefix, request.input.items.clone(), true, Some(max_output))
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
        self.apply(prefix, items, false, None)
    }

    fn apply(
        &mut self,
        prefix: Option<Prefix>,
        items: Vec<Item>,
        open_turn: bool,
        max_output: Option<usize>,
    ) -> Result<Turn> {
        let mut next = self.chain.clone();
        let mut open = next.open_calls.as_ref().clone();
        admit_calls(&mut open, &items)?;
        let history = next.history_len();
        // An empty chain renders its prefix first, whatever it is.
        let prefix = match prefix {
            None if history == 0 => Some(Prefix::default()),
            p if history == 0 => p,
            p => p.filter(|p| p != next.prefix()),
        };
        let invalidated = prefix.is_some() && history > 1;
        let mut steps = Vec::with_capacity(history + items.len() + 1);
        let from = match prefix {
            Some(p) => {
                steps.push(Step::Prefix(PrefixEntry::new(p)));
                steps.extend(next.replay(1, history));
                0
            }
            None => history,
        };
        steps.extend(items.into_iter().map(|item| Step::Item(Arc::new(item))));
        if open_turn {
            steps.push(Step::Header);
        }
        let work = next.rewrite(self.format.as_ref(), from, steps);
        next.open_calls = Arc::new(open);
        let prompt_tokens = next.tokens.len();
        if let Some(max_output) = max_output {
            check_context_budget(
                work.kept,
                prompt_tokens - work.kept,
                max_output,
                self.context_window,
            )?;
        }
        self.replace_chain(next);
        self.count(&work);
        if invalidated {
            self.stats.invalidations += 1;
        }
        if open_turn {
            self.turns += 1;
        }
        Ok(Turn {
            prompt_tokens,
            cached_tokens: work.kept,
            new_tokens: prompt_tokens - work.kept,
            invalidated,
        })
    }

    /// Install a chain built from the current one, accounting the bytes it added and
    /// dropped (a walk over the nodes that differ, not over the history).
    fn replace_chain(&mut self, mut next: Chain) {
        let added = next.unique_bytes(Some(&self.chain));
        let dropped = self.chain.unique_bytes(Some(&next));
        next.bytes = self.chain.bytes + added - dropped;
        self.chain = next;
    }

    fn count(&mut self, work: &Work) {
        self.stats.segments_rendered += work.segments as u64;
        self.stats.tokens_rendered += work.tokens as u64;
        self.stats.tokens_reused += work.kept as u64;
    }

    /// Grow the last item's text by `chunk`; returns how many tokens at the end of the
    /// prompt changed. Re-tokenizes only from just before the join when that checks out
    /// against the cached ids, otherwise re-renders the item's segment.
    pub fn append_text(&mut self, chunk: &str) -> Result<usize> {
        if chunk.is_empty() {
            return Ok(0);
        }
        let before = self.chain.tokens.clone();
        let mut next = self.chain.clone();
        let closed = next
            .turn_open()
            .then(|| next.rewrite(self.format.as_ref(), next.segments.len() - 1, Vec::new()));
        let last = next.segments.len().saturating_sub(1);
        let seg = next.segments.get(last).cloned();
        let (Some(Body::Item(old)), true) = (seg.as_ref().map(|s| &s.body), last > 0) else {
            return Err(Error::new(
                Code::InvalidValue,
                "append_text grows the last input item, and the conversation does not end with one",
            ));
        };
        let new = Arc::new(grown(old, chunk));
        if let Some(work) = closed {
            self.count(&work);
        }
        match self.regrow_last(&mut next, last, old, &new) {
            Regrowth::Done(kept) => {
                self.stats.segments_rendered += 1;
                self.stats.tokens_reused += kept as u64;
                self.stats.tokens_rendered += (next.tokens.len() - kept) as u64;
            }
            outcome => {
                let work = next.rewrite(self.format.as_ref(), last, vec![Step::Item(Arc::clone(&new))]);
                self.count(&work);
                if outcome == Regrowth::CheckFailed {
                    self.stats.text_fallbacks += 1;
                }
            }
        }
        self.replace_chain(next);
        Ok(self.chain.tokens.len() - before.common_prefix_len(&self.chain.tokens))
    }

    /// The fast path of `append_text`: find the one text of the item's rendering that grew
    /// and re-tokenize its end in place.
    fn regrow_last(&self, chain: &mut Chain, last: usize, old: &Item, new: &Arc<Item>) -> Regrowth {
        let format = self.format.as_ref();
        let tokenizer = format.tokenizer().as_ref();
        let seg = chain.segment(last).clone();
        let prev = chain.segment(last - 1).kind();
        let record = |item: &Item| {
            let recorder = Recorder::new(tokenizer);
            let (shape, run) = {
                let mut r = Renderer::new(&recorder);
                r.text(seg.carried.as_deref().unwrap_or(""));
                let lookup = |id: &str| chain.call_name(id);
                let ctx = Context {
                    prev,
                    call_name: &lookup,
                };
                format.render_item(&ctx, item, &mut r);
                r.into_parts()
            };
            Recording {
                shape,
                texts: recorder.into_texts(),
                run,
            }
        };
        let (was, now) = (record(old), record(new));
        let Some(change) = was.change(&now) else {
            return Regrowth::Restructured;
        };
        let (text, old_text, new_text, end, floor) = match change {
            Change::Text { index, after } => {
                let after: usize = after
                    .iter()
                    .map(|p| match p {
                        Position::Id => 1,
                        Position::Text(i) => {
                            let mut ids = Vec::new();
                            tokenizer.encode(&was.texts[*i], &mut ids);
                            ids.len()
                        }
                    })
                    .sum();
                let end = chain.final_len().saturating_sub(after);
                (Some(index), &was.texts[index], &now.texts[index], end, seg.start)
            }
            Change::Run => (None, &was.run, &now.run, chain.tokens.len(), chain.final_len()),
        };
        if end < floor {
            return Regrowth::CheckFailed;
        }
        let hint = chain
            .hint
            .filter(|h| h.segment == last && h.text == text)
            .map(|h| h.byte);
        let tokens = &chain.tokens;
        let Some(regrown) = growth::regrow(tokenizer, old_text, new_text, hint, |n| {
            tokens.to_vec(end.saturating_sub(n).max(floor), end)
        }) else {
            return Regrowth::CheckFailed;
        };
        let kept = end - regrown.drop;
        let tail = chain.tokens.to_vec(end, chain.tokens.len());
        chain.tokens.truncate(kept);
        chain.tokens.extend_from_slice(&regrown.ids);
        chain.tokens.extend_from_slice(&tail);
        if text.is_none() {
            chain.run = Arc::from(now.run.as_str());
            chain.run_tokens = chain.run_tokens - regrown.drop + regrown.ids.len();
        }
        chain.segments.truncate(last);
        chain.segments.push(Segment {
            body: Body::Item(Arc::clone(new)),
            ..seg
        });
        chain.hint = Some(GrowthHint {
            segment: last,
            text,
            byte: regrown.hint,
        });
        Regrowth::Done(kept)
    }

    /// Tokens so far, including the assistant header when a turn is open.
    pub fn prompt(&self) -> Prompt {
        Prompt {
            tokens: self.chain.tokens.clone(),
        }
    }

    /// The prompt an engine is given to answer now: the conversation and the assistant
    /// turn's header (the generation prompt), whether or not a turn is open. The
    /// conversation is unchanged (the header is rendered on a shared copy).
    pub fn engine_prompt(&self) -> Prompt {
        if self.chain.turn_open() {
            return self.prompt();
        }
        let mut next = self.chain.clone();
        let history = next.history_len();
        next.rewrite(self.format.as_ref(), history, vec![Step::Header]);
        Prompt { tokens: next.tokens }
    }

    fn open_turn_id(&self) -> Result<TurnId> {
        TurnId::open(self.chain.turn_open(), self.id, self.turns)
    }

    /// A parser for the open turn's output.
    pub fn parser(&self) -> Result<TurnParser> {
        Ok(TurnParser::new(self.format.parser(), self.open_turn_id()?))
    }

    /// Append the ids the parser saw, verbatim, and record its items (function calls
    /// become open calls). Closes the turn.
    pub fn commit_output(&mut self, parser: &TurnParser) -> Result<()> {
        if self.open_turn_id()? != parser.turn {
            return Err(Error::new(
                Code::InvalidValue,
                "this parser belongs to another turn or conversation",
            ));
        }
        let items: Arc<[Item]> = parser.items().into();
        let mut open = self.chain.open_calls.as_ref().clone();
        for item in items.iter() {
            if let Item::FunctionCall { call_id, name, .. } = item {
                open.push(OpenCall {
                    call_id: call_id.clone(),
                    name: name.clone(),
                });
            }
        }
        let from = self.chain.segments.len();
        let step = Step::Output {
            items,
            sampled: parser.sampled().to_vec(),
        };
        let mut next = self.chain.clone();
        let work = next.rewrite(self.format.as_ref(), from, vec![step]);
        next.open_calls = Arc::new(open);
        self.replace_chain(next);
        self.count(&work);
        Ok(())
    }

    /// Append a stored model turn (rebuilds from a store): the generation header, then
    /// `ids`, the output segment exactly as `commit_output` rendered it, verbatim, with
    /// `items_json` (the response's `output` array) as its items, so its function calls
    /// become open calls with their original call ids. Nothing is re-tokenized: the
    /// rebuilt prompt is the one the original conversation held. On error the
    /// conversation is unchanged.
    pub fn append_output_json(&mut self, items_json: &str, ids: &[u32]) -> Result<()> {
        self.output_json(items_json, ids, true)?;
        self.turns += 1;
        Ok(())
    }

    /// Close the open turn with `ids` as its output segment and `items_json` (output
    /// items) as its items, as `commit_output` does with a parser's: for output that
    /// keeps items the client already saw (an interrupted response's completed items,
    /// whose function calls keep their call ids). On error the conversation is unchanged.
    pub fn commit_items_json(&mut self, items_json: &str, ids: &[u32]) -> Result<()> {
        self.open_turn_id()?;
        self.output_json(items_json, ids, false)
    }

    fn output_json(&mut self, items_json: &str, ids: &[u32], header: bool) -> Result<()> {
        let vocab = self.format.tokenizer().vocab_size();
        let items: Arc<[Item]> = parse_stored_output(items_json, ids, vocab)?.into();
        let mut next = self.chain.clone();
        let mut open = next.open_calls.as_ref().clone();
        admit_calls(&mut open, &items)?;
        let from = next.segments.len();
        let mut steps = Vec::with_capacity(2);
        if header {
            steps.push(Step::Header);
        }
        steps.push(Step::Output {
            items,
            sampled: ids.to_vec(),
        });
        let work = next.rewrite(self.format.as_ref(), from, steps);
        next.open_calls = Arc::new(open);
        self.replace_chain(next);
        self.count(&work);
        Ok(())
    }

    /// Freeze the current position (one per response id).
    pub fn checkpoint(&mut self) -> Checkpoint {
        let memory_bytes = self.chain.unique_bytes(self.base.as_ref());
        self.base = Some(self.chain.clone());
        Checkpoint {
            format: Arc::clone(&self.format),
            context_window: self.context_window,
            chain: self.chain.clone(),
            memory_bytes,
        }
    }

    pub fn token_count(&self) -> usize {
        self.chain.tokens.len()
    }

    /// Everything this conversation holds (shared or not).
    pub fn memory_bytes(&self) -> usize {
        size_of::<Conversation>() + self.chain.bytes
    }

    /// Call ids of function calls that have no output yet, oldest first.
    pub fn open_call_ids(&self) -> Vec<String> {
        self.chain.open_calls.iter().map(|c| c.call_id.clone()).collect()
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }
}

#[cfg(test)]
mod tests;
