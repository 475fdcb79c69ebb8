//! [`PromptBuilder`]: how a conversation's items become its prompt tokens, declared once
//! for the two ways hotloop builds a prompt:
//!
//! - [`super::segments::SegmentBuilder`]: item by item through a [`ChatFormat`]
//!   (harmony, ChatML), each item a segment rendered and tokenized once;
//! - [`super::template::TemplateBuilder`]: a model's own chat template, rendered and
//!   tokenized by difference (`format::template::prompt`).
//!
//! A builder is the part of a conversation's state that depends on how the prompt is
//! built; [`super::Conversation`] holds one and does everything else the same way for
//! both (open function calls, the context budget, turn bookkeeping, checkpoints). Every
//! mutating method is called on a copy that the conversation installs only when the
//! whole operation succeeds: a builder may fail half way.
//!
//! [`ChatFormat`]: crate::format::ChatFormat

use std::any::Any;
use std::sync::Arc;

use super::{OpenCall, Prompt};
use crate::error::Result;
use crate::format::OutputParser;
use crate::item::{Item, Prefix};
use crate::tokenizer::Tokenizer;

/// What appending items did to the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Leading tokens kept from before the append.
    pub kept: usize,
    /// Earlier history was rendered again (see [`super::Turn::invalidated`]).
    pub invalidated: bool,
}

/// The prompt of one conversation, built incrementally. Cloning it is O(1) in the
/// history (checkpoints and forks share it). `calls` is always the function calls that
/// were open before the operation (a tool result's function name, for formats that
/// render it).
pub trait PromptBuilder: Any + Send + Sync {
    /// A copy sharing the history (the conversation's transactions and checkpoints).
    fn boxed_clone(&self) -> Box<dyn PromptBuilder>;

    fn tokenizer(&self) -> &Arc<dyn Tokenizer>;

    /// The prefix (instructions, tools) the prompt is rendered with.
    fn prefix(&self) -> &Prefix;

    /// The prompt ends with the assistant turn's header (the generation prompt).
    fn turn_open(&self) -> bool;

    /// Append `items`, after putting `prefix` in place of the current one when given
    /// (it differs from it), and open the assistant turn when `open_turn`.
    fn append(
        &mut self,
        prefix: Option<Prefix>,
        items: &[Item],
        open_turn: bool,
        calls: &[OpenCall],
    ) -> Result<Appended>;

    /// Grow the last item's text by `chunk` (which is not empty), closing an open turn;
    /// returns how many tokens at the end of the prompt changed.
    fn grow_last(&mut self, chunk: &str, calls: &[OpenCall]) -> Result<usize>;

    /// Append the model's turn: `items` parsed from the `sampled` ids. `open_first`: the
    /// turn is not open yet (a stored turn appended in a rebuild); open it first.
    fn append_output(
        &mut self,
        items: &[Item],
        sampled: &[u32],
        open_first: bool,
        calls: &[OpenCall],
    ) -> Result<()>;

    fn prompt(&self) -> Prompt;

    /// The prompt with the assistant turn's header after it, built on a copy (called
    /// when no turn is open).
    fn generation_prompt(&self, calls: &[OpenCall]) -> Result<Prompt>;

    /// A parser for the output of the turn the prompt opens.
    fn parser(&self) -> Box<dyn OutputParser>;

    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Everything this builder holds, shared or not.
    fn memory_bytes(&self) -> usize;

    /// The bytes this builder holds that `base` (an earlier state of it) does not.
    fn unique_bytes(&self, base: Option<&dyn PromptBuilder>) -> usize;

    /// Work counters by name (`Conversation.stats` in Python).
    fn stats(&self) -> Vec<(&'static str, u64)>;

    /// Counters start again from zero (a fork's).
    fn reset_stats(&mut self);
}

impl Clone for Box<dyn PromptBuilder> {
    fn clone(&self) -> Self {
        self.boxed_clone()
    }
}

/// `base` as the builder type `B` it must be (a conversation's earlier state is always
/// of its own type).
pub(crate) fn same_kind<B: PromptBuilder>(base: Option<&dyn PromptBuilder>) -> Option<&B> {
    base.and_then(|b| (b as &dyn Any).downcast_ref::<B>())
}
