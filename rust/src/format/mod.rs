//! Chat formats: how a conversation becomes special tokens and text, and how sampled
//! tokens become protocol items again.
//!
//! A format renders the prefix (instructions, tools), each item, and the generation
//! header into a [`Renderer`]. Items are rendered one at a time with only a small
//! [`Context`] about their neighbours, so appending items appends tokens.

use std::sync::Arc;

mod call_json;
pub mod chatml;
pub mod harmony;
pub(crate) mod output;
pub mod template;
pub mod toolcall;
#[cfg(test)]
pub(crate) mod transcript;

use crate::item::{Item, ItemKind, Prefix};
use crate::render::Renderer;
use crate::tokenizer::Tokenizer;

/// What a format may know about the conversation when rendering one item.
pub struct Context<'a> {
    /// The kind of the item rendered just before (None right after the prefix).
    pub prev: Option<ItemKind>,
    /// Function name of an earlier call, by call id (tool results in harmony name the function).
    pub call_name: &'a dyn Fn(&str) -> Option<String>,
}

/// One protocol-level event from the streaming output parser.
/// `index` is the output item index within the response.
#[derive(Debug, Clone, PartialEq)]
pub enum ParseEvent {
    MessageStart {
        index: usize,
    },
    TextDelta {
        index: usize,
        text: String,
    },
    MessageDone {
        index: usize,
        text: String,
    },
    ReasoningStart {
        index: usize,
    },
    ReasoningDelta {
        index: usize,
        text: String,
    },
    ReasoningDone {
        index: usize,
        text: String,
    },
    CallStart {
        index: usize,
        name: String,
        call_id: String,
    },
    ArgumentsDelta {
        index: usize,
        text: String,
    },
    CallDone {
        index: usize,
        name: String,
        call_id: String,
        arguments: String,
    },
}

/// How the model's output ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A stop token: the turn is complete.
    Stopped,
    /// The token budget ran out (or the engine stopped) before a stop token.
    Truncated,
    /// The output did not follow the format; the message says how.
    Malformed(String),
}

/// Streaming parser: one token at a time in, protocol events out. Never panics on
/// any input sequence.
pub trait OutputParser: Send {
    fn feed(&mut self, id: u32, out: &mut Vec<ParseEvent>);
    /// End of output (engine finished); closes open items.
    fn finish(&mut self, out: &mut Vec<ParseEvent>) -> Outcome;
    /// The completed output items so far (function calls carry their minted call ids).
    fn items(&self) -> &[Item];
    /// A stop token was sampled: the engine should stop.
    fn stopped(&self) -> bool;
    /// Tokens fed so far (usage `output_tokens`).
    fn output_tokens(&self) -> usize;
    /// Of those, the tokens of reasoning items (usage `reasoning_tokens`).
    fn reasoning_tokens(&self) -> usize;
}

pub trait ChatFormat: Send + Sync {
    /// `harmony`, `chatml`, ...
    fn name(&self) -> &str;

    fn tokenizer(&self) -> &Arc<dyn Tokenizer>;

    fn render_prefix(&self, prefix: &Prefix, r: &mut Renderer);

    fn render_item(&self, ctx: &Context, item: &Item, r: &mut Renderer);

    /// The tokens that open the assistant turn the model completes.
    fn render_generation_header(&self, ctx: &Context, r: &mut Renderer);

    /// Append a finished model turn to history: the sampled ids verbatim, with a final
    /// stop token normalised to the format's end-of-message token where they differ
    /// (harmony samples `<|return|>` but history holds `<|end|>`). It leaves the turn as
    /// `render_item` leaves the last output item, so the next item's `Context::prev` is
    /// that item's kind (ChatML defers the closing `<|im_end|>` to the next segment).
    fn render_output(&self, sampled: &[u32], r: &mut Renderer);

    /// Tokens that end generation.
    fn stop_tokens(&self) -> &[u32];

    fn parser(&self) -> Box<dyn OutputParser>;

    /// The ids a model would sample after the generation header to produce these
    /// items, ending with a stop token (used by the simulated engine).
    fn render_completion(&self, items: &[Item], r: &mut Renderer);
}
