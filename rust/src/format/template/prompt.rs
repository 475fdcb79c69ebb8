//! The incremental prompt of one conversation under a chat template: render, find the
//! first byte that differs from the text held, keep every token before the last restart
//! point before it, tokenize only the rest.
//!
//! Restart points are the ends of special tokens (text is never merged across one) and,
//! in verbatim mode, the ends of sampled outputs. Between two of them the text is one
//! run; a change re-encodes from the start of its run, so a turn costs the new text plus
//! the run it joins (the generation prompt's `assistant\n`, typically).
//!
//! Rendering the whole message list every turn would still be O(history). A template
//! that passes the *probe* (every prefix of a canned conversation renders to a prefix of
//! the next, and rendering a window — the first message plus the last few — gives the
//! same tail as rendering everything) is rendered by window: the old and new windows are
//! rendered, and their difference is spliced onto the text held. Every
//! `check_every`-th window render is checked against a full render; a mismatch turns the
//! conversation to full renders for good (counted). Templates that rewrite history
//! (Qwen3 dropping earlier reasoning, a date in the system turn) fail the probe and are
//! rendered whole, still tokenized incrementally; each rewrite is counted.

use std::borrow::Borrow;
use std::mem::size_of;
use std::sync::Arc;

use minijinja::Value;
use serde_json::{json, Value as Json};

use super::messages::{Arguments, ChatMessages};
use super::specials::Specials;
use super::{message_value, ChatTemplate, RenderOptions};
use crate::chunks::{Addressable, Chunks, Element};
use crate::error::{Code, Error, Result};
use crate::item::Item;
use crate::tokenizer::Tokenizer;
use crate::validate;

/// Messages before the first changed one that a window render includes, so templates
/// that look at the previous message (grouping tool results, role alternation) see it.
const CONTEXT: usize = 2;

/// Messages every window starts with: the system message and the first user message,
/// which templates treat specially (Llama 3.1 puts the tools into it).
const ANCHOR: usize = 2;

/// Work counters of one conversation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TemplateStats {
    pub turns: u64,
    /// Renders of the whole message list.
    pub full_renders: u64,
    /// Renders of a window (first message + tail) instead.
    pub window_renders: u64,
    /// Window renders checked against a full render, and those that disagreed.
    pub window_checks: u64,
    pub window_mismatches: u64,
    /// Turns whose first changed byte lay before the end of the previous turn's
    /// messages: the template rewrote history.
    pub rewrites: u64,
    pub tokens_kept: u64,
    pub tokens_encoded: u64,
    pub bytes_encoded: u64,
}

impl TemplateStats {
    pub fn pairs(&self) -> [(&'static str, u64); 9] {
        [
            ("turns", self.turns),
            ("full_renders", self.full_renders),
            ("window_renders", self.window_renders),
            ("window_checks", self.window_checks),
            ("window_mismatches", self.window_mismatches),
            ("rewrites", self.rewrites),
            ("tokens_kept", self.tokens_kept),
            ("tokens_encoded", self.tokens_encoded),
            ("bytes_encoded", self.bytes_encoded),
        ]
    }
}

/// What the probe found out about a template under one conversation's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stability {
    /// Window renders are allowed.
    pub append_stable: bool,
    /// ... only while no message carries reasoning (Qwen3 drops earlier turns' reasoning,
    /// and renders the rest append-stable).
    pub without_reasoning_only: bool,
    /// Why not, for logs and docs.
    pub reason: Option<String>,
    /// The text `add_generation_prompt=true` appends, when it only appends.
    pub generation_prompt: Option<String>,
}

/// How a conversation renders.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Allow window renders for templates that pass the probe.
    pub window: bool,
    /// Check every n-th window render against a full render (0: never).
    pub check_every: u64,
    /// Keep sampled ids verbatim where the template renders them unchanged.
    pub verbatim: bool,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            window: true,
            check_every: 64,
            verbatim: false,
        }
    }
}

/// A restart point `(byte, token)` of the held text.
impl Element for (usize, usize) {
    const LEAF: usize = 32;
    fn heap_bytes(&self) -> usize {
        0
    }
    fn shares_heap(&self, _: &Self) -> bool {
        true
    }
}

impl Addressable for (usize, usize) {}

/// A rendered and tokenized conversation that grows turn by turn.
///
/// Cloning it (a checkpoint, a fork) shares the text, the ids and the restart points
/// (persistent [`Chunks`]) and the messages (`Arc`s): it copies two pointer arrays,
/// one entry per message, never the history's text.
#[derive(Clone)]
pub struct TemplatePrompt {
    template: Arc<ChatTemplate>,
    specials: Arc<Specials>,
    options: Arc<RenderOptions>,
    policy: Policy,
    stability: Option<Stability>,
    messages: ChatMessages,
    /// Template values of `messages`, converted once.
    values: Vec<Value>,
    text: Chunks<u8>,
    ids: Chunks<u32>,
    /// Restart points `(byte, token)`, ascending, starting with `(0, 0)`.
    bounds: Chunks<(usize, usize)>,
    /// Messages in `text`, and whether it ends with a generation prompt.
    rendered: usize,
    generation: bool,
    /// Bytes of verbatim output appended after the last render.
    output_len: usize,
    /// `render([first message])`: the head every window render starts with.
    head: Option<Arc<str>>,
    /// Some message carried reasoning (sticky).
    has_reasoning: bool,
    stats: TemplateStats,
}

impl TemplatePrompt {
    pub fn new(
        template: Arc<ChatTemplate>,
        specials: Arc<Specials>,
        instructions: Option<&str>,
        options: RenderOptions,
        policy: Policy,
    ) -> TemplatePrompt {
        let mut bounds = Chunks::default();
        bounds.push((0, 0));
        let messages = ChatMessages::new(instructions, template.arguments());
        TemplatePrompt {
            template,
            specials,
            options: Arc::new(options),
            policy,
            stability: None,
            messages,
            values: Vec::new(),
            text: Chunks::default(),
            ids: Chunks::default(),
            bounds,
            rendered: 0,
            generation: false,
            output_len: 0,
            head: None,
            has_reasoning: false,
            stats: TemplateStats::default(),
        }
    }

    pub fn template(&self) -> &Arc<ChatTemplate> {
        &self.template
    }

    pub fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        self.specials.tokenizer()
    }

    /// The ids that end the model's turn under this template and vocabulary.
    pub fn stop_tokens(&self) -> Vec<u32> {
        self.template.stop_tokens(self.specials.tokenizer().as_ref())
    }

    /// The rendered text (copied out of the shared chunks).
    pub fn text(&self) -> String {
        self.text_range(0, self.text.len())
    }

    /// All ids, shared (`Prompt` takes them without copying).
    pub fn id_chunks(&self) -> &Chunks<u32> {
        &self.ids
    }

    pub fn ids(&self) -> Vec<u32> {
        self.ids.to_vec(0, self.ids.len())
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn messages(&self) -> &[Arc<Json>] {
        self.messages.messages()
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Text bytes `start..end`, cut at character boundaries (renders and verbatim
    /// outputs are whole UTF-8 texts, and every cut is a common-prefix length).
    fn text_range(&self, start: usize, end: usize) -> String {
        String::from_utf8(self.text.to_vec(start, end)).expect("the held text is cut at character boundaries")
    }

    /// The prompt ends by opening a reasoning block (`<think>\n`, `[THINK]`): the
    /// model's output starts inside it.
    pub fn opens_reasoning(&self) -> bool {
        let tail = self
            .text
            .to_vec(self.text.len().saturating_sub(32), self.text.len());
        let tail = String::from_utf8_lossy(&tail);
        let tail = tail.trim_end_matches('\n');
        tail.ends_with("<think>") || tail.ends_with("[THINK]")
    }

    /// Replace the instructions and the render options (a request whose prefix
    /// changed): the next prompt renders everything and keeps the tokens before the
    /// first byte that differs.
    pub fn set_prefix(&mut self, instructions: Option<&str>, options: RenderOptions) {
        self.messages.set_instructions(instructions);
        self.options = Arc::new(options);
        self.stability = None;
        self.head = None;
    }

    /// Grow the last message's text by `chunk`; false when it has no text content.
    pub fn grow_last(&mut self, chunk: &str) -> bool {
        self.messages.grow_last(chunk)
    }

    /// Bytes this prompt holds that `base` (an earlier state it was cloned from) does
    /// not share.
    pub fn memory_bytes(&self, base: Option<&TemplatePrompt>) -> usize {
        let messages = self.messages.messages();
        let shared = |i: usize| {
            base.and_then(|b| b.messages.messages().get(i))
                .is_some_and(|m| Arc::ptr_eq(m, &messages[i]))
        };
        let new_messages: usize = (0..messages.len())
            .filter(|&i| !shared(i))
            .map(|i| json_bytes(&messages[i]))
            .sum();
        self.text.unique_bytes(base.map(|b| &b.text))
            + self.ids.unique_bytes(base.map(|b| &b.ids))
            + self.bounds.unique_bytes(base.map(|b| &b.bounds))
            + messages.len() * (size_of::<Arc<Json>>() + size_of::<Value>())
            + new_messages
    }

    pub fn stats(&self) -> TemplateStats {
        self.stats
    }

    /// Start counting from zero (a fork counts its own work).
    pub fn reset_stats(&mut self) {
        self.stats = TemplateStats::default();
    }

    /// The probe's verdict (after the first prompt).
    pub fn stability(&self) -> Option<&Stability> {
        self.stability.as_ref()
    }

    pub fn push_items<'a>(&mut self, items: impl IntoIterator<Item = &'a Item>) {
        self.messages.push_items(items);
    }

    /// Append Responses-API input items given as a JSON array, validated as request
    /// input is.
    pub fn push_items_json(&mut self, items_json: &str) -> Result<()> {
        let raw: &serde_json::value::RawValue = serde_json::from_str(items_json)
            .map_err(|e| Error::new(Code::InvalidJson, format!("items are not JSON: {e}")))?;
        let input = validate::parse_input(Some(raw), &validate::Limits::default())?;
        self.messages.push_items(&input.items);
        Ok(())
    }

    /// Append a chat message as given (for callers that hold messages, not items).
    pub fn push_message(&mut self, message: Json) {
        self.messages.push_raw(message);
    }

    /// Verbatim mode: after a prompt that ended with the generation prompt, the model
    /// sampled `ids` (its stop token included). They join the held tokens as they are;
    /// the next prompt keeps them if the template renders their text unchanged.
    pub fn push_output(&mut self, ids: &[u32]) {
        let mut bytes = Vec::new();
        self.specials.tokenizer().decode_bytes(ids, &mut bytes);
        let Ok(text) = String::from_utf8(bytes) else {
            return; // Not text: the next prompt re-encodes exactly from before it.
        };
        self.push_bound();
        self.text.extend_from_slice(text.as_bytes());
        self.ids.extend_from_slice(ids);
        self.push_bound();
        self.output_len += text.len();
    }

    fn push_bound(&mut self) {
        let bound = (self.text.len(), self.ids.len());
        if self.bounds.last() != Some(&bound) {
            self.bounds.push(bound);
        }
    }

    /// Bring the prompt up to date with the messages; returns how many leading ids were
    /// kept from the previous prompt (`ids()[kept..]` are new).
    pub fn prompt(&mut self, add_generation_prompt: bool) -> Result<usize> {
        if self.stability.is_none() {
            // New options (set_prefix): their tool definitions are the client's content.
            if let Some(tools) = &self.options.tools {
                let tools = tools
                    .iter()
                    .map(|t| self.specials.content(t).into_owned())
                    .collect();
                self.options = Arc::new(RenderOptions {
                    tools: Some(tools),
                    kwargs: self.options.kwargs.clone(),
                });
            }
            self.stability = Some(if self.policy.window {
                probe(&self.template, &self.options)
            } else {
                Stability {
                    append_stable: false,
                    without_reasoning_only: false,
                    reason: Some("window renders are off".into()),
                    generation_prompt: generation_prompt(&self.template, &self.options),
                }
            });
        }
        self.stats.turns += 1;
        let changed = self.messages.take_changed().min(self.rendered);
        // The old values of the window, before the changed messages are converted again.
        let start = window_start(changed, last_user(&self.messages.messages()[..self.rendered]));
        let old_window: Vec<Value> = self.values.get(start..self.rendered).unwrap_or_default().to_vec();
        self.values.truncate(changed);
        let fresh: Vec<Value> = self.messages.messages()[changed..]
            .iter()
            .map(|m| message_value(&self.specials.content(m)))
            .collect();
        self.has_reasoning |= self.messages.messages()[changed..]
            .iter()
            .any(|m| carries_reasoning(m));
        self.values.extend(fresh);
        if changed < ANCHOR {
            self.head = None;
        }
        let windowed = self.append_stable() && start > ANCHOR && !self.text.is_empty();
        let (at, tail) = if windowed {
            match self.window_diff(start, &old_window, add_generation_prompt)? {
                Some(diff) => diff,
                None => self.full_diff(add_generation_prompt)?,
            }
        } else {
            self.full_diff(add_generation_prompt)?
        };
        let rendered_len = self.text.len() - self.output_len;
        let ends_messages = rendered_len - if self.generation { self.generation_len() } else { 0 };
        if at < ends_messages {
            self.stats.rewrites += 1;
        }
        let kept = self.apply(at, &tail);
        self.rendered = self.values.len();
        self.generation = add_generation_prompt;
        self.output_len = 0;
        Ok(kept)
    }

    /// Whether the next prompt may render a window (the probe passed for what the
    /// conversation holds).
    pub fn append_stable(&self) -> bool {
        self.stability
            .as_ref()
            .is_some_and(|s| s.append_stable && !(s.without_reasoning_only && self.has_reasoning))
    }

    fn generation_len(&self) -> usize {
        self.stability
            .as_ref()
            .and_then(|s| s.generation_prompt.as_ref())
            .map_or(0, String::len)
    }

    /// Render everything; the first differing byte and the new text from there.
    fn full_diff(&mut self, add_generation_prompt: bool) -> Result<(usize, String)> {
        self.stats.full_renders += 1;
        let new = self
            .template
            .render_values(&self.values, add_generation_prompt, &self.options)?;
        let at = held_prefix(&self.text, &new);
        Ok((at, new[at..].to_owned()))
    }

    /// Render the old and new windows and splice their difference onto the held text;
    /// None when the held text does not end with the old window's tail.
    fn window_diff(
        &mut self,
        start: usize,
        old_window: &[Value],
        add_generation_prompt: bool,
    ) -> Result<Option<(usize, String)>> {
        let head = match &self.head {
            Some(head) => Arc::clone(head),
            None => {
                let head: Arc<str> = self
                    .template
                    .render_values(&self.values[..ANCHOR], false, &self.options)?
                    .into();
                self.head = Some(Arc::clone(&head));
                head
            }
        };
        let anchor = &self.values[..ANCHOR];
        let old = self
            .template
            .render_values(&window(anchor, old_window), self.generation, &self.options)?;
        let new = self.template.render_values(
            &window(anchor, &self.values[start..]),
            add_generation_prompt,
            &self.options,
        )?;
        // Only the held text the old window covers is read (and copied): from where its
        // tail starts, to the end.
        let rendered = self.text.len() - self.output_len;
        let Some(from) = old
            .strip_prefix(&*head)
            .and_then(|old_tail| rendered.checked_sub(old_tail.len()))
        else {
            return Ok(None);
        };
        let held = self.text_range(from, self.text.len());
        let Some((at, tail)) = splice(&held, rendered - from, &head, &old, &new) else {
            return Ok(None);
        };
        let at = from + at;
        self.stats.window_renders += 1;
        let check = self.policy.check_every;
        if check > 0 && self.stats.window_renders.is_multiple_of(check) {
            self.stats.window_checks += 1;
            let full = self
                .template
                .render_values(&self.values, add_generation_prompt, &self.options)?;
            let same_head = full.get(..at).is_some_and(|f| held_prefix(&self.text, f) == at);
            if !same_head || full[at..] != tail {
                self.stats.window_mismatches += 1;
                if let Some(s) = self.stability.as_mut() {
                    s.append_stable = false;
                    s.reason = Some("a window render disagreed with the full render".into());
                }
                let at = held_prefix(&self.text, &full);
                return Ok(Some((at, full[at..].to_owned())));
            }
        }
        Ok(Some((at, tail)))
    }

    /// Keep the text before `at`, append `tail`, re-encode from the last restart point
    /// at or before `at`. Returns the number of ids kept.
    fn apply(&mut self, at: usize, tail: &str) -> usize {
        // The restart points at or before `at` (binary search: they ascend).
        let (mut lo, mut hi) = (0, self.bounds.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.bounds.get(mid).is_some_and(|&(byte, _)| byte <= at) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        self.bounds.truncate(lo.max(1));
        let (byte, token) = *self.bounds.last().expect("bounds start with (0, 0)");
        self.ids.truncate(token);
        let mut run = self.text_range(byte, at);
        run.push_str(tail);
        self.text.truncate(at);
        self.text.extend_from_slice(tail.as_bytes());
        let (mut ids, mut after) = (Vec::new(), Vec::new());
        self.specials.encode(&run, byte, &mut ids, &mut after);
        self.ids.extend_from_slice(&ids);
        for (b, t) in after {
            self.bounds.push((b, token + t));
        }
        self.stats.tokens_kept += token as u64;
        self.stats.tokens_encoded += ids.len() as u64;
        self.stats.bytes_encoded += run.len() as u64;
        token
    }
}

/// Where a window render starts, given the first changed message: `CONTEXT` messages
/// earlier, and no later than the last user message before the change (Qwen3 decides
/// how to render each assistant turn from where the last user message is; without one,
/// the window is the whole list), after the anchor messages (which every window holds).
fn window_start(changed: usize, last_user: Option<usize>) -> usize {
    // With no user message yet, the whole list is one user turn: no window.
    let start = changed.saturating_sub(CONTEXT);
    last_user.map_or(ANCHOR, |u| start.min(u)).max(ANCHOR)
}

/// Index of the last user message.
fn last_user<M: Borrow<Json>>(messages: &[M]) -> Option<usize> {
    messages
        .iter()
        .rposition(|m| m.borrow().get("role").and_then(Json::as_str) == Some("user"))
}

/// The anchor messages followed by the tail.
fn window(anchor: &[Value], tail: &[Value]) -> Vec<Value> {
    anchor.iter().chain(tail).cloned().collect()
}

/// Splice the difference of two window renders onto `held`, whose first `rendered`
/// bytes are the full render of the old messages (verbatim output may follow): the byte
/// where the new full render differs from `held` and the new text from there. None when
/// the held render does not end with the old window's part (the windows do not line up).
fn splice(held: &str, rendered: usize, head: &str, old: &str, new: &str) -> Option<(usize, String)> {
    let old_tail = old.strip_prefix(head)?;
    let new_tail = new.strip_prefix(head)?;
    if !held[..rendered].ends_with(old_tail) {
        return None;
    }
    let from = rendered - old_tail.len();
    let p = common_prefix(&held[from..], new_tail);
    Some((from + p, new_tail[p..].to_owned()))
}

/// Length of the common prefix of the held text and `new`, on a character boundary
/// (of both: they agree on every byte before it).
fn held_prefix(held: &Chunks<u8>, new: &str) -> usize {
    let new_bytes = new.as_bytes();
    let (mut n, mut differs) = (0, false);
    held.for_each_slice(0, new_bytes.len(), &mut |s| {
        if differs {
            return;
        }
        let same = s.iter().zip(&new_bytes[n..]).take_while(|(x, y)| x == y).count();
        n += same;
        differs = same < s.len();
    });
    while !new.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// Approximate heap bytes of a JSON value (its strings plus a node overhead).
fn json_bytes(value: &Json) -> usize {
    size_of::<Json>()
        + match value {
            Json::String(s) => s.len(),
            Json::Array(a) => a.iter().map(json_bytes).sum(),
            Json::Object(o) => o.iter().map(|(k, v)| k.len() + json_bytes(v)).sum(),
            _ => 0,
        }
}

/// Length of the common prefix of `a` and `b`, on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a
        .as_bytes()
        .iter()
        .zip(b.as_bytes())
        .take_while(|(x, y)| x == y)
        .count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// A conversation that exercises what templates treat specially: a system message,
/// several user turns, reasoning, text, tool calls and their results.
fn probe_messages(arguments: Arguments) -> Vec<Json> {
    let arguments = arguments.value(r#"{"q": 1}"#);
    let call = |id: &str| json!([{"id": id, "type": "function", "function": {"name": "probe_tool", "arguments": arguments}}]);
    vec![
        json!({"role": "system", "content": "You are a probe."}),
        json!({"role": "user", "content": "First question?"}),
        json!({"role": "assistant", "content": "First answer.", "reasoning": "r1", "reasoning_content": "r1"}),
        json!({"role": "user", "content": "Second question?"}),
        json!({"role": "assistant", "content": "", "tool_calls": call("call_1")}),
        json!({"role": "tool", "content": "result one", "tool_call_id": "call_1"}),
        json!({"role": "assistant", "content": "", "reasoning": "r2", "reasoning_content": "r2", "tool_calls": call("call_2")}),
        json!({"role": "tool", "content": "result two", "tool_call_id": "call_2"}),
        json!({"role": "assistant", "content": "Second answer."}),
        json!({"role": "user", "content": "Third question?"}),
        json!({"role": "assistant", "content": "Third answer."}),
    ]
}

/// The text `add_generation_prompt=true` appends to the probe's first messages, when it
/// only appends.
fn generation_prompt(template: &ChatTemplate, options: &RenderOptions) -> Option<String> {
    let values: Vec<Value> = probe_messages(template.arguments())[..ANCHOR]
        .iter()
        .map(message_value)
        .collect();
    let without = template.render_values(&values, false, options).ok()?;
    let with = template.render_values(&values, true, options).ok()?;
    with.strip_prefix(without.as_str()).map(str::to_owned)
}

/// A message the template may render reasoning for.
fn carries_reasoning(message: &Json) -> bool {
    ["reasoning_content", "reasoning", "thinking"].iter().any(|k| {
        message
            .get(k)
            .and_then(Json::as_str)
            .is_some_and(|s| !s.is_empty())
    })
}

/// Decide whether window renders are exact for this template and these options: every
/// prefix of the probe conversation must render to a prefix of the next one, and the
/// window render of each step must give the same text as the full render. A template
/// that passes only once reasoning is taken out of the probe is window-rendered while
/// the conversation has none.
pub fn probe(template: &ChatTemplate, options: &RenderOptions) -> Stability {
    let messages = probe_messages(template.arguments());
    let full = probe_with(template, options, &messages);
    if full.append_stable {
        return full;
    }
    let plain: Vec<Json> = messages
        .into_iter()
        .map(|mut m| {
            if let Some(o) = m.as_object_mut() {
                for k in ["reasoning_content", "reasoning", "thinking"] {
                    o.remove(k);
                }
            }
            m
        })
        .collect();
    let without = probe_with(template, options, &plain);
    if without.append_stable {
        return Stability {
            without_reasoning_only: true,
            reason: full.reason.map(|r| format!("with reasoning: {r}")),
            ..without
        };
    }
    full
}

fn probe_with(template: &ChatTemplate, options: &RenderOptions, messages: &[Json]) -> Stability {
    let values: Vec<Value> = messages.iter().map(message_value).collect();
    // Known whether or not windows are allowed: what the generation prompt appends is
    // never history, so a turn that changes it rewrites nothing.
    let generation_prompt = generation_prompt(template, options);
    let unstable = |reason: String| Stability {
        append_stable: false,
        without_reasoning_only: false,
        reason: Some(reason),
        generation_prompt: generation_prompt.clone(),
    };
    let render = |msgs: &[Value], agp: bool| template.render_values(msgs, agp, options);
    let head = match render(&values[..ANCHOR], false) {
        Ok(head) => head,
        Err(e) => return unstable(format!("the probe does not render: {}", e.message)),
    };
    // Each step appends one message to a prompt that ended with the generation prompt,
    // as a turn does; the spliced window renders must give the full render.
    for n in ANCHOR + 1..=values.len() {
        let start = window_start(n - 1, last_user(&messages[..n - 1]));
        if start <= ANCHOR {
            continue; // The window is the whole list: rendered whole anyway.
        }
        let step = || -> Result<bool> {
            let old = render(&values[..n - 1], true)?;
            let new = render(&values[..n], true)?;
            let old_window = render(&window(&values[..ANCHOR], &values[start..n - 1]), true)?;
            let new_window = render(&window(&values[..ANCHOR], &values[start..n]), true)?;
            Ok(splice(&old, old.len(), &head, &old_window, &new_window)
                .is_some_and(|(at, tail)| new.get(..at) == Some(&old[..at]) && new[at..] == tail))
        };
        match step() {
            Ok(true) => {}
            Ok(false) => {
                return unstable(format!(
                    "message {} renders differently without the messages before it",
                    n - 1
                ))
            }
            Err(e) => return unstable(format!("the probe does not render at message {n}: {}", e.message)),
        }
    }
    Stability {
        append_stable: true,
        without_reasoning_only: false,
        reason: None,
        generation_prompt,
    }
}
