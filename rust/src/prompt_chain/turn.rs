//! The output side of one turn: the format's streaming parser, wrapped so that the ids it
//! saw are exactly what `Conversation::commit_output` appends to history.

use crate::error::{Code, Error, Result};
use crate::format::{Outcome, OutputParser, ParseEvent};
use crate::item::Item;

/// What `Conversation::extend` and `append_items` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Turn {
    pub prompt_tokens: usize,
    /// Prompt tokens served from the cache: kept, not rendered again.
    pub cached_tokens: usize,
    /// Prompt tokens rendered by this call.
    pub new_tokens: usize,
    /// Earlier history was re-rendered: the prefix (instructions, tools) changed, or a
    /// chat template rendered earlier messages differently (counted per format in
    /// `/metrics`).
    pub invalidated: bool,
}

/// Identifies the open turn a parser was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TurnId {
    pub conversation: u64,
    pub serial: u64,
}

impl TurnId {
    /// The id of a conversation's open turn; an error when no turn is open.
    pub(crate) fn open(turn_open: bool, conversation: u64, serial: u64) -> Result<TurnId> {
        if !turn_open {
            return Err(Error::new(
                Code::InvalidValue,
                "no assistant turn is open: call extend before parsing or committing output",
            ));
        }
        Ok(TurnId { conversation, serial })
    }
}

pub struct TurnParser {
    inner: Box<dyn OutputParser>,
    sampled: Vec<u32>,
    pub(crate) turn: TurnId,
}

impl TurnParser {
    pub(crate) fn new(inner: Box<dyn OutputParser>, turn: TurnId) -> Self {
        TurnParser {
            inner,
            sampled: Vec::new(),
            turn,
        }
    }

    /// A parser for a turn outside any `Conversation` (the chat-template prompt): it
    /// cannot be committed to a conversation.
    pub fn detached(inner: Box<dyn OutputParser>) -> Self {
        TurnParser::new(
            inner,
            TurnId {
                conversation: u64::MAX,
                serial: 0,
            },
        )
    }

    /// Feed one sampled id. Ids after a stop token are not part of the turn and are ignored.
    pub fn feed(&mut self, id: u32, out: &mut Vec<ParseEvent>) {
        if self.inner.stopped() {
            return;
        }
        self.sampled.push(id);
        self.inner.feed(id, out);
    }

    pub fn finish(&mut self, out: &mut Vec<ParseEvent>) -> Outcome {
        self.inner.finish(out)
    }

    /// A stop token was sampled: the engine should stop.
    pub fn stopped(&self) -> bool {
        self.inner.stopped()
    }

    pub fn output_tokens(&self) -> usize {
        self.inner.output_tokens()
    }

    /// Sampled ids that fell inside reasoning items.
    pub fn reasoning_tokens(&self) -> usize {
        self.inner.reasoning_tokens()
    }

    /// The ids this turn sampled, verbatim: what `commit_output` appends.
    pub fn sampled(&self) -> &[u32] {
        &self.sampled
    }

    pub fn items(&self) -> &[Item] {
        self.inner.items()
    }
}
