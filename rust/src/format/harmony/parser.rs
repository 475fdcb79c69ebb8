//! The streaming harmony parser: sampled ids in, one at a time, protocol events out.
//!
//! Like openai-harmony's `StreamableParser` it is a small state machine (header,
//! content, between messages) that decides what a message is as soon as its header ends
//! (`<|message|>`), then streams its content. Unlike it, anything off-format becomes
//! [`Outcome::Malformed`] with the reason, never an error the caller must handle and
//! never a panic; after a failure the [`MarkupParser`] it runs in ignores further tokens.
//!
//! [`MarkupParser`]: crate::format::output::MarkupParser

use std::sync::Arc;

use super::{Specials, FUNCTIONS};
use crate::format::output::{Markup, OpenKind, OutputItems, SampledText};
use crate::format::{Outcome, ParseEvent};
use crate::item::{Item, Tool};
use crate::tokenizer::Tokenizer;

/// A header is a role, a recipient, a channel and a content type: a few tokens. A long
/// one means the model never wrote `<|message|>`.
const MAX_HEADER_TOKENS: usize = 128;

#[derive(Debug)]
enum State {
    /// Collecting header tokens up to `<|message|>`. `first`: the generation header
    /// already wrote `<|start|>assistant`, so no role follows.
    Header {
        tokens: Vec<u32>,
        first: bool,
    },
    Content {
        reasoning: bool,
    },
    /// After `<|end|>`: the next message must begin with `<|start|>`.
    BetweenMessages,
    Stopped,
}

/// What a parsed header says the message is.
#[derive(Debug, PartialEq)]
enum Header {
    Text,
    Reasoning,
    Call(String),
}

pub struct HarmonyParser {
    tokenizer: Arc<dyn Tokenizer>,
    s: Specials,
    state: State,
    items: OutputItems,
    text: SampledText,
    reasoning_tokens: usize,
}

impl HarmonyParser {
    pub fn new(tokenizer: Arc<dyn Tokenizer>, specials: Specials) -> HarmonyParser {
        HarmonyParser {
            tokenizer,
            s: specials,
            state: State::Header {
                tokens: Vec::new(),
                first: true,
            },
            items: OutputItems::default(),
            text: SampledText::default(),
            reasoning_tokens: 0,
        }
    }

    fn name_of(&self, id: u32) -> String {
        String::from_utf8_lossy(self.tokenizer.token_bytes(id)).into_owned()
    }

    fn close(&mut self, out: &mut Vec<ParseEvent>) -> Result<(), String> {
        if !self.text.is_complete() {
            return Err("message ended inside a UTF-8 character".to_owned());
        }
        self.items.close(out);
        Ok(())
    }

    /// Decode and interpret a header the way openai-harmony does: the channel follows
    /// `<|channel|>`; of the remaining words, `to=X` is the recipient and a word after it
    /// the content type (`<|constrain|>json`).
    fn parse_header(&self, tokens: &[u32], first: bool) -> Result<Header, String> {
        let mut bytes = Vec::new();
        // Skip the leading <|start|> of later messages; specials inside decode to their text.
        let body = if first { tokens } else { &tokens[1..] };
        self.tokenizer.decode_bytes(body, &mut bytes);
        let text = String::from_utf8(bytes).map_err(|_| "message header is not valid UTF-8".to_owned())?;

        let (channel, rest) = match text.find("<|channel|>") {
            Some(at) => {
                let after = &text[at + "<|channel|>".len()..];
                let len = after
                    .find(|c: char| c.is_whitespace() || c == '<')
                    .unwrap_or(after.len());
                if len == 0 {
                    return Err("<|channel|> with no channel name in the header".to_owned());
                }
                (Some(&after[..len]), format!("{}{}", &text[..at], &after[len..]))
            }
            None => (None, text.clone()),
        };
        let rest = rest.replace("<|constrain|>", " <|constrain|>");
        let mut words: Vec<&str> = rest.split_ascii_whitespace().collect();
        if words.first() == Some(&"assistant") {
            words.remove(0);
        } else if !first {
            return Err(format!(
                "message header {text:?} does not start with the assistant role"
            ));
        }
        let recipient = match words.as_slice() {
            [] => None,
            [one] => Some(one.strip_prefix("to=").unwrap_or(one)),
            [to, _content_type] if to.starts_with("to=") => to.strip_prefix("to="),
            _ => return Err(format!("unexpected words in message header {text:?}")),
        };

        match (recipient, channel) {
            // `functions.NAME` calls a plain function tool, `NS.NAME` one of a namespace
            // tool's (its qualified name); a recipient without a namespace is no function.
            (Some(recipient), _) => match Tool::split_name(recipient) {
                Some((_, "")) => Err(format!("function call with no name in header {text:?}")),
                Some((FUNCTIONS, name)) => Ok(Header::Call(name.to_owned())),
                Some(("", _)) | None => Err(format!(
                    "call to {recipient:?}: only namespaced tools (functions.*, NS.*) are offered"
                )),
                Some(_) => Ok(Header::Call(recipient.to_owned())),
            },
            (None, Some("analysis")) => Ok(Header::Reasoning),
            (None, Some("final" | "commentary")) => Ok(Header::Text),
            (None, Some(other)) => Err(format!("unknown channel {other:?}")),
            (None, None) => Err(format!("message header {text:?} has no channel")),
        }
    }
}

impl Markup for HarmonyParser {
    fn read(&mut self, id: u32, out: &mut Vec<ParseEvent>) -> Result<(), String> {
        if id as usize >= self.tokenizer.vocab_size() {
            return Err(format!("token id {id} is outside the vocabulary"));
        }
        let s = self.s;
        match &mut self.state {
            State::Stopped => return Err(format!("token {} after the stop token", self.name_of(id))),
            State::BetweenMessages if id == s.start => {
                self.state = State::Header {
                    tokens: vec![id],
                    first: false,
                };
            }
            State::BetweenMessages => {
                return Err(format!(
                    "expected <|start|> after <|end|>, got {:?}",
                    self.name_of(id)
                ));
            }
            State::Header { tokens, first } => {
                if id == s.message {
                    let first = *first;
                    let header_len = tokens.len() + 1;
                    let header = std::mem::take(tokens);
                    let kind = self.parse_header(&header, first)?;
                    let reasoning = kind == Header::Reasoning;
                    if reasoning {
                        self.reasoning_tokens += header_len;
                    }
                    match kind {
                        Header::Text => self.items.start(OpenKind::Message, "", out),
                        Header::Reasoning => self.items.start(OpenKind::Reasoning, "", out),
                        Header::Call(name) => self.items.start(OpenKind::Call, &name, out),
                    }
                    self.state = State::Content { reasoning };
                } else if self.tokenizer.is_special(id) && id != s.channel && id != s.constrain {
                    return Err(format!(
                        "unterminated message header: {} before <|message|>",
                        self.name_of(id)
                    ));
                } else if tokens.len() >= MAX_HEADER_TOKENS {
                    return Err(format!("message header longer than {MAX_HEADER_TOKENS} tokens"));
                } else {
                    tokens.push(id);
                }
            }
            State::Content { reasoning } => {
                if *reasoning {
                    self.reasoning_tokens += 1;
                }
                if !self.tokenizer.is_special(id) {
                    let mut text = String::new();
                    self.text.push(self.tokenizer.as_ref(), id, &mut text)?;
                    self.items.push(&text, out);
                    return Ok(());
                }
                let is_call = self.items.open_kind() == Some(OpenKind::Call);
                if id == s.end {
                    self.close(out)?;
                    self.state = State::BetweenMessages;
                } else if (id == s.ret && !is_call) || (id == s.call && is_call) {
                    // A text ends the turn with <|return|>, a call with <|call|>.
                    self.close(out)?;
                    self.state = State::Stopped;
                } else if id == s.ret || id == s.call {
                    let what = if is_call { "a function call" } else { "a message" };
                    return Err(format!("{} ended {what}", self.name_of(id)));
                } else if id == s.start {
                    return Err("<|start|> inside a message: the message was never ended".to_owned());
                } else {
                    return Err(format!(
                        "unexpected special token {} inside a message",
                        self.name_of(id)
                    ));
                }
            }
        }
        Ok(())
    }

    fn end(&mut self, out: &mut Vec<ParseEvent>) -> Outcome {
        match self.state {
            State::Stopped => Outcome::Stopped,
            State::Content { .. } => {
                // Cut off mid-message: keep what was written, minus a partial character.
                self.text.clear();
                self.items.close(out);
                self.state = State::BetweenMessages;
                Outcome::Truncated
            }
            State::Header { .. } | State::BetweenMessages => Outcome::Truncated,
        }
    }

    fn items(&self) -> &[Item] {
        self.items.items()
    }

    fn stopped(&self) -> bool {
        matches!(self.state, State::Stopped)
    }

    fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }
}
