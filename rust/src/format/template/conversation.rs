//! A conversation under a chat template, with the surface of
//! [`crate::conversation::Conversation`]: extend it with a request, parse and commit the
//! model's turn, take checkpoints and fork from them. The protocol layer and `TokenCache`
//! serve any template through it as they serve the hand-written formats.
//!
//! The state is one [`TemplatePrompt`] (incremental by difference, see `cache`), the
//! request prefix it was rendered with and the open function calls. A checkpoint is a
//! clone of it, which shares the text and ids (persistent chunks) and the messages.
//! A committed model turn becomes messages (its parsed items) and is rendered as the
//! template renders it, so the next prompt equals `tokenizers.encode(render(...))`; in
//! verbatim mode the sampled ids are kept where the template renders their text unchanged.

use std::borrow::Cow;
use std::mem::size_of;
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use super::cache::{Policy as RenderPolicy, TemplatePrompt, TemplateStats};
use super::messages::tool_definitions;
use super::specials::{ContentSpecials, Specials};
use super::{ChatTemplate, RenderOptions};
use crate::conversation::{
    admit_calls, check_request, next_conversation_id, parse_append, parse_stored_output, OpenCall, Prompt,
    Turn, TurnId, TurnParser,
};
use crate::error::{Code, Error, Result};
use crate::format::toolcall::Family;
use crate::item::{Item, Prefix};
use crate::tokenizer::Tokenizer;
use crate::validate::{check_context_budget, CreateRequest, Policy};

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
    fn options(&self, prefix: &Prefix) -> RenderOptions {
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
    fn template_items<'a>(&self, items: &'a [Item]) -> Cow<'a, [Item]> {
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

/// The template conversation of one response chain.
pub struct TemplateConversation {
    format: Arc<TemplateFormat>,
    context_window: usize,
    state: State,
    /// The state of the last checkpoint (what the next one shares).
    base: Option<TemplatePrompt>,
    id: u64,
    turns: u64,
}

/// What a checkpoint freezes; cloning it shares the history.
#[derive(Clone)]
struct State {
    prompt: TemplatePrompt,
    prefix: Prefix,
    open_calls: Arc<Vec<OpenCall>>,
    turn_open: bool,
    /// Rendering the last committed output rewrote earlier text: the next turn's
    /// prompt is `invalidated`.
    rewrite_pending: bool,
}

/// An immutable position in a template conversation (one per response id).
#[derive(Clone)]
pub struct TemplateCheckpoint {
    format: Arc<TemplateFormat>,
    context_window: usize,
    state: State,
    memory_bytes: usize,
}

impl TemplateCheckpoint {
    pub fn token_count(&self) -> usize {
        self.state.prompt.len()
    }

    /// Bytes this checkpoint holds that the checkpoint before it in its chain does not.
    pub fn memory_bytes(&self) -> usize {
        self.memory_bytes
    }

    pub fn prompt(&self) -> Prompt {
        Prompt {
            tokens: self.state.prompt.id_chunks().clone(),
        }
    }

    /// A conversation continuing from here; shares the history. Its stats start at zero.
    pub fn fork(&self) -> TemplateConversation {
        let mut state = self.state.clone();
        state.prompt.reset_stats();
        TemplateConversation {
            format: Arc::clone(&self.format),
            context_window: self.context_window,
            base: Some(state.prompt.clone()),
            state,
            id: next_conversation_id(),
            turns: 0,
        }
    }
}

impl TemplateConversation {
    pub fn new(format: Arc<TemplateFormat>, context_window: usize) -> TemplateConversation {
        let prompt = TemplatePrompt::new(
            Arc::clone(&format.template),
            Arc::clone(&format.specials),
            None,
            format.options(&Prefix::default()),
            format.policy,
        );
        TemplateConversation {
            format,
            context_window,
            state: State {
                prompt,
                prefix: Prefix::default(),
                open_calls: Arc::new(Vec::new()),
                turn_open: false,
                rewrite_pending: false,
            },
            base: None,
            id: next_conversation_id(),
            turns: 0,
        }
    }

    pub fn prefix(&self) -> &Prefix {
        &self.state.prefix
    }

    /// Check the request, append its items (its prefix when it changed), render and
    /// tokenize by difference, and open the assistant turn. On error the conversation is
    /// unchanged.
    pub fn extend_request(&mut self, request: &CreateRequest, policy: Option<&Policy>) -> Result<Turn> {
        check_request(request, self.prefix(), policy)?;
        let prefix = (request.prefix != self.state.prefix).then(|| request.prefix.clone());
        let max_output = request.max_output_tokens.map_or(0, |n| n as usize);
        self.apply(prefix, &request.input.items, true, Some(max_output))
    }

    /// Append input items given as JSON (`instructions`/`tools_json` None keep the
    /// current ones), without opening a turn.
    pub fn append_json(
        &mut self,
        items_json: &str,
        instructions: Option<String>,
        tools_json: Option<&str>,
    ) -> Result<Turn> {
        let (items, prefix) = parse_append(self.prefix(), items_json, instructions, tools_json)?;
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
        let mut open = next.open_calls.as_ref().clone();
        admit_calls(&mut open, items)?;
        let prefix = prefix.filter(|p| *p != next.prefix);
        self.format.specials.check_input(prefix.as_ref(), items)?;
        let invalidated = prefix.is_some() && !next.prompt.is_empty();
        if let Some(prefix) = prefix {
            next.prompt
                .set_prefix(prefix.instructions.as_deref(), self.format.options(&prefix));
            next.prefix = prefix;
        }
        next.prompt.push_items(self.format.template_items(items).iter());
        let rewrites = next.prompt.stats().rewrites;
        let kept = next.prompt.prompt(open_turn)?;
        let invalidated = invalidated || next.rewrite_pending || next.prompt.stats().rewrites > rewrites;
        next.rewrite_pending = false;
        let prompt_tokens = next.prompt.len();
        if let Some(max_output) = max_output {
            check_context_budget(kept, prompt_tokens - kept, max_output, self.context_window)?;
        }
        next.open_calls = Arc::new(open);
        next.turn_open = open_turn;
        self.state = next;
        if open_turn {
            self.turns += 1;
        }
        Ok(Turn {
            prompt_tokens,
            cached_tokens: kept,
            new_tokens: prompt_tokens - kept,
            invalidated,
        })
    }

    /// Grow the last message's text by `chunk` (a message or tool output arriving in
    /// chunks); returns how many tokens at the end of the prompt changed.
    pub fn append_text(&mut self, chunk: &str) -> Result<usize> {
        if chunk.is_empty() {
            return Ok(0);
        }
        let mut next = self.state.clone();
        if !next.prompt.grow_last(chunk) {
            return Err(Error::new(
                Code::InvalidValue,
                "append_text grows the last message's text, and the conversation does not end with one",
            ));
        }
        let kept = next.prompt.prompt(false)?;
        next.turn_open = false;
        let changed = next.prompt.len() - kept;
        self.state = next;
        Ok(changed)
    }

    pub fn prompt(&self) -> Prompt {
        Prompt {
            tokens: self.state.prompt.id_chunks().clone(),
        }
    }

    /// The prompt an engine is given to answer now: the render with
    /// `add_generation_prompt=True`, whether or not a turn is open. The conversation is
    /// unchanged (the render is made on a shared copy).
    pub fn engine_prompt(&self) -> Result<Prompt> {
        if self.state.turn_open {
            return Ok(self.prompt());
        }
        let mut prompt = self.state.prompt.clone();
        prompt.prompt(true)?;
        Ok(Prompt {
            tokens: prompt.id_chunks().clone(),
        })
    }

    fn open_turn_id(&self) -> Result<TurnId> {
        TurnId::open(self.state.turn_open, self.id, self.turns)
    }

    /// A parser for the open turn's output: the template's family, starting inside
    /// reasoning when the generation prompt opened it.
    pub fn parser(&self) -> Result<TurnParser> {
        let family = self.format.family();
        let parser = family.parser(
            Arc::clone(self.format.tokenizer()),
            self.format.stop.clone(),
            self.state.prompt.opens_reasoning(),
        );
        Ok(TurnParser::new(parser, self.open_turn_id()?))
    }

    /// Record the model's turn: its items become the assistant message(s) and are
    /// rendered as the template renders them (verbatim mode keeps the sampled ids where
    /// the render agrees with them). Closes the turn.
    pub fn commit_output(&mut self, parser: &TurnParser) -> Result<()> {
        if self.open_turn_id()? != parser.turn {
            return Err(Error::new(
                Code::InvalidValue,
                "this parser belongs to another turn or conversation",
            ));
        }
        self.record_output(parser.items(), parser.sampled(), false)
    }

    /// Append a stored model turn (rebuilds from a store): its `output` items, and in
    /// verbatim mode its ids after a generation prompt. On error the conversation is
    /// unchanged.
    pub fn append_output_json(&mut self, items_json: &str, ids: &[u32]) -> Result<()> {
        self.output_json(items_json, ids, true)?;
        self.turns += 1;
        Ok(())
    }

    /// Close the open turn with `items_json` (output items) and their sampled `ids`, as
    /// `commit_output` does with a parser's: for output that keeps items the client
    /// already saw (an interrupted response's completed items, whose function calls keep
    /// their call ids). On error the conversation is unchanged.
    pub fn commit_items_json(&mut self, items_json: &str, ids: &[u32]) -> Result<()> {
        self.open_turn_id()?;
        self.output_json(items_json, ids, false)
    }

    fn output_json(&mut self, items_json: &str, ids: &[u32], open_first: bool) -> Result<()> {
        let vocab = self.format.tokenizer().vocab_size();
        let items = parse_stored_output(items_json, ids, vocab)?;
        self.record_output(&items, ids, open_first)
    }

    fn record_output(&mut self, items: &[Item], sampled: &[u32], open_first: bool) -> Result<()> {
        let mut next = self.state.clone();
        let mut open = next.open_calls.as_ref().clone();
        admit_calls(&mut open, items)?;
        if next.prompt.policy().verbatim {
            if open_first {
                next.prompt.prompt(true)?;
            }
            next.prompt.push_output(sampled);
        }
        next.prompt.push_items(self.format.template_items(items).iter());
        let rewrites = next.prompt.stats().rewrites;
        next.prompt.prompt(false)?;
        next.rewrite_pending |= next.prompt.stats().rewrites > rewrites;
        next.open_calls = Arc::new(open);
        next.turn_open = false;
        self.state = next;
        Ok(())
    }

    /// Freeze the current position (one per response id).
    pub fn checkpoint(&mut self) -> TemplateCheckpoint {
        let memory_bytes =
            self.state.prompt.memory_bytes(self.base.as_ref()) + open_call_bytes(&self.state.open_calls);
        self.base = Some(self.state.prompt.clone());
        TemplateCheckpoint {
            format: Arc::clone(&self.format),
            context_window: self.context_window,
            state: self.state.clone(),
            memory_bytes,
        }
    }

    pub fn token_count(&self) -> usize {
        self.state.prompt.len()
    }

    /// Everything this conversation holds (shared or not).
    pub fn memory_bytes(&self) -> usize {
        size_of::<TemplateConversation>()
            + self.state.prompt.memory_bytes(None)
            + open_call_bytes(&self.state.open_calls)
    }

    /// Call ids of function calls that have no output yet, oldest first.
    pub fn open_call_ids(&self) -> Vec<String> {
        self.state.open_calls.iter().map(|c| c.call_id.clone()).collect()
    }

    pub fn stats(&self) -> TemplateStats {
        self.state.prompt.stats()
    }

    /// The prompt itself (its text, messages and probe verdict).
    pub fn template_prompt(&self) -> &TemplatePrompt {
        &self.state.prompt
    }
}

fn open_call_bytes(calls: &[OpenCall]) -> usize {
    calls
        .iter()
        .map(|c| size_of::<OpenCall>() + c.call_id.len() + c.name.len())
        .sum()
}

#[cfg(test)]
#[path = "conversation_tests.rs"]
mod tests;
